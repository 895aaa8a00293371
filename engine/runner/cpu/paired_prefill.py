"""Runs two prefill chunks at once on MLX's CPU backend: layer by layer, alternating between two
MLX streams, each stream's matmuls on one BLAS thread.

Why: one chunk on one stream leaves a core mostly idle. Every non-BLAS operation (attention,
SwiGLU, norms, K/V writes) runs on the stream's one thread while the second BLAS thread spins, and
OpenBLAS splits these matmul shapes over two threads at about 1.4x of one. Two chunks on two
streams keep both cores on useful work. Measured here (two 205-token chunks of SmolLM2-135M,
6 alternating rounds): one after the other with 2 BLAS threads 1,269 ms, paired 934 ms (median).
The layers must alternate: MLX's CPU backend lets the host run only about ten operations ahead of
the device, so a whole forward launched on one stream holds the other stream back until it ends.

Owns the two streams and the layer loop. Used only for backbones that are embed -> layers -> norm
under one causal mask (every layer's cache in the model's make_cache a plain KVCache), checked at load
against the backbone's own call. Never touches block tables or the pools: the caches it is given hold
their K/V back until both forwards are done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from engine.platform.blas import blas_thread_setter
from engine.runner.fast_path import Target, cache_refusal

import mlx.core as mx
from mlx import nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

SetThreads = Callable[[int], int]  # sets the BLAS thread count, returns the previous one


class PairedPrefill:
    def __init__(self, backbone: nn.Module, set_blas_threads: SetThreads):
        self._backbone = backbone
        self._set_blas_threads = set_blas_threads
        self._streams = threading.local()  # MLX streams belong to the thread that made them

    def _thread_streams(self) -> tuple[mx.Stream, mx.Stream]:
        if not hasattr(self._streams, "pair"):
            self._streams.pair = (mx.new_stream(mx.cpu), mx.new_stream(mx.cpu))
        return self._streams.pair

    def hidden(self, tokens: Sequence[mx.array], caches: Sequence[list]) -> list[mx.array]:
        """The backbone's hidden states for two (1, L_i) token rows, each with its layer caches.
        Evaluated on return: the BLAS thread count is restored only once both streams are done."""
        assert len(tokens) == len(caches) == 2
        previous = self._set_blas_threads(1)
        try:
            states = _interleaved(self._backbone, tokens, caches, self._thread_streams())
            mx.eval(states)
        finally:
            self._set_blas_threads(previous)
        return states


def _interleaved(backbone: nn.Module, tokens, caches, streams) -> list[mx.array]:
    states, masks = [], []
    for ids, cache, stream in zip(tokens, caches, streams):
        with mx.stream(stream):
            h = backbone.embed_tokens(ids)
            states.append(h)
            masks.append(create_attention_mask(h, cache[0]))
    for i, layer in enumerate(backbone.layers):
        for j, stream in enumerate(streams):
            with mx.stream(stream):
                states[j] = layer(states[j], masks[j], cache=caches[j][i])
                mx.async_eval(states[j])  # both streams get work before the host builds the next layer
    out = []
    for h, stream in zip(states, streams):
        with mx.stream(stream):
            out.append(backbone.norm(h))
    return out


class PairedPrefillPath:
    """The plug-in (engine/runner/fast_path.py): prefill chunks two at a time on two CPU streams."""

    name = "paired_prefill"
    role = "prefill"
    setting = "paired_prefill"
    devices: tuple[str, ...] = ("cpu",)

    def applies(self, target: Target) -> str | None:
        if target.device != "cpu":
            return "needs MLX's CPU backend (two CPU streams)"
        if blas_thread_setter() is None:
            return "needs OpenBLAS, whose thread count it sets per pair"
        if target.head is None:
            return "the model's head does not split from its backbone (engine/runner/model_head.py)"
        backbone = getattr(target.model, "model", None)
        if not all(isinstance(getattr(backbone, n, None), nn.Module) for n in ("embed_tokens", "norm")):
            return "the backbone is not embed -> layers -> norm"
        if not getattr(backbone, "layers", None):
            return "the backbone has no layers"
        # One causal mask serves every layer here, and the load probe is shorter than any window: only
        # the model's own caches tell that some layer attends through a window.
        return cache_refusal(target.model)

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[PairedPrefill | None, str | None]:
        setter = blas_thread_setter()
        assert setter is not None
        paired = make_paired_prefill(target.model, setter)
        return (
            (paired, None) if paired else (None, "the layer loop differs from the backbone's call on a probe")
        )


def make_paired_prefill(model: nn.Module, set_blas_threads: SetThreads) -> PairedPrefill | None:
    """A PairedPrefill for `model`, or None where the layer loop would not reproduce `model.model(...)`
    (checked on a short probe)."""
    backbone = model.model
    layers = backbone.layers
    paired = PairedPrefill(backbone, set_blas_threads)
    probes = [mx.array([[1, 2, 3, 4, 5]], dtype=mx.int32), mx.array([[6, 7, 8]], dtype=mx.int32)]
    try:
        # The reference runs on one BLAS thread too: OpenBLAS splits a matmul over threads in an order
        # of its own, so a 2-thread forward may differ in the last bits and prove nothing here.
        previous = set_blas_threads(1)
        try:
            whole = [backbone(p, cache=[KVCache() for _ in layers]) for p in probes]
            mx.eval(whole)
        finally:
            set_blas_threads(previous)
        pair = paired.hidden(probes, [[KVCache() for _ in layers] for _ in probes])
        same = all(a.shape == b.shape and mx.array_equal(a, b).item() for a, b in zip(whole, pair))
    except (TypeError, ValueError, AttributeError):
        return None
    return paired if same else None
