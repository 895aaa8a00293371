"""Routes an mlx-lm model's attention calls to the cache that holds the layer's K/V.

Owns only the wrapper around each model module's `scaled_dot_product_attention`; never reads or
writes KV itself. mlx-lm models call `scaled_dot_product_attention(q, k, v, cache=, scale=, mask=)`
with whatever `cache.update_and_fetch` returned. A paged cache may return its pools instead of a
gathered context, to read K/V where they lie; it then says so and answers for the attention:

    cache.deferred                                    True: update_and_fetch returned the pools
    cache.paged_attention(queries, keys, values, scale) -> (B, heads, L, D)
    cache.gather(keys, values) -> (k_context, v_context, mask)   for mlx-lm's own attention, used
                                                      when the call carries what the fast path does
                                                      not know (attention sinks, extra arguments)

A cache may also hand over `cache.context_attention`, a device's attention over the context it
returned (engine/runner/backends.py picks it: on MLX's CPU backend engine/runner/cpu/cpu_math.py's,
whose softmax avoids MLX's scalar exp). Every other call goes straight to mlx-lm's function.
"""

from __future__ import annotations

import sys

import mlx.core as mx
from mlx import nn


def install(model: nn.Module) -> bool:
    """Wraps the attention function of the model's modules once. False where the model's module
    has no such function: its caches must then hand back gathered context."""
    module = sys.modules.get(type(model).__module__)
    layers = getattr(model, "layers", None) or getattr(getattr(model, "model", None), "layers", [])
    modules = {module} | {
        sys.modules.get(type(getattr(layer, "self_attn", layer)).__module__) for layer in layers
    }
    patched = False
    for mod in modules:
        original = getattr(mod, "scaled_dot_product_attention", None)
        if mod is None or original is None:
            continue
        if not getattr(original, "_paged_hook", False):
            mod.scaled_dot_product_attention = _dispatch(original)  # type: ignore[attr-defined]  # the module's global
        patched = True
    return patched


def _dispatch(original):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None, **kwargs):
        extra = {"sinks": sinks} if sinks is not None else {}
        if getattr(cache, "deferred", False):
            if not extra and not kwargs:
                return cache.paged_attention(queries, keys, values, scale)
            keys, values, mask = cache.gather(keys, values)
        attention = getattr(cache, "context_attention", None)
        if attention is not None and not extra and not kwargs:
            return attention(queries, keys, values, scale, mask)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, **extra, **kwargs)

    scaled_dot_product_attention._paged_hook = True
    return scaled_dot_product_attention


class _RouteProbe:
    """A deferred cache that records whether its layer's attention reached it with the very K/V its
    `update_and_fetch` returned. A layer that uses them outside the attention call, or passes it
    something else (MLA: the latent as both K and V, the rotary keys used apart), would read raw pools."""

    offset = 0
    deferred = True

    def __init__(self) -> None:
        self.routed = False
        self._fetched: tuple[mx.array, mx.array] | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self._fetched = (keys, values)
        return keys, values

    def _reached(self, keys: mx.array, values: mx.array) -> None:
        fetched = self._fetched
        self.routed = fetched is not None and keys is fetched[0] and values is fetched[1]

    def paged_attention(self, queries: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
        self._reached(keys, values)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale)

    def gather(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array, None]:
        self._reached(keys, values)
        return keys, values, None

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> None:
        return None


def pool_refusal(model: nn.Module) -> str | None:
    """Why a path whose caches hand the attention their pools (`deferred`) cannot serve `model`, or None."""
    if not install(model):
        return "the model's attention cannot be hooked"
    if not _routes_every_layer(model):
        # plamo tiles the K/V it fetched, stablelm casts them: over pools, either reads the wrong rows.
        return "a layer's attention does not take the very K/V its cache returned"
    return None


def _routes_every_layer(model: nn.Module) -> bool:
    """With the hook installed, checks with one lazy one-token forward that every layer's attention goes
    through it: a layer that calls MLX's attention itself would read raw pools as context."""
    probes = [_RouteProbe() for _ in model.layers]
    try:
        model(mx.array([[0]]), cache=probes)
    except (AttributeError, TypeError, ValueError, IndexError):  # it asks its caches for more than K/V
        return False
    return all(p.routed for p in probes)
