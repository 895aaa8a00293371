"""Fuses projections of the same input into one product, for GPUs where every kernel launch counts: each
MLP's gate and up, and each attention's q, k and v.

Owns only the rewrite of already-loaded mlx-lm modules; the model's own code still runs unchanged:
`mlp.gate_proj(x)` and `mlp.up_proj(x)` become two parts of one `x @ [W_gate; W_up].T`, computed once
for the `x` both are called with, and likewise q, k and v. Plain `nn.Linear` layers (with or without
bias, all alike) and `nn.QuantizedLinear` layers of one quantization are fused; anything else is left
as it is. The parts replace the originals, so the weights are held once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx import nn

Linear = Callable[[mx.array], mx.array]


class FusedLinears:
    """One product for several projections of the same input; remembers the last input it saw."""

    def __init__(self, linear: Linear, sizes: list[int]):
        self.linear = linear
        self.bounds = [0, *itertools.accumulate(sizes)]
        self._last: tuple[mx.array, list[mx.array]] | None = None

    def parts(self, x: mx.array) -> list[mx.array]:
        if self._last is None or self._last[0] is not x:
            out = self.linear(x)
            self._last = (x, [out[..., a:b] for a, b in itertools.pairwise(self.bounds)])
        return self._last[1]


class _Part(nn.Module):
    def __init__(self, fused: FusedLinears, index: int):
        super().__init__()
        self._fused = fused
        self._index = index

    def __call__(self, x: mx.array) -> mx.array:
        return self._fused.parts(x)[self._index]


def concat_linears(modules: list[Any]) -> nn.Module | None:
    """One module whose output is the modules' outputs side by side, or None where they differ in kind."""
    if all(type(m) is nn.Linear for m in modules):
        return _concat(nn.Linear(1, 1), modules, ["weight"])
    if all(type(m) is nn.QuantizedLinear for m in modules):
        first = modules[0]
        same = {(m.group_size, m.bits, m.mode, m.weight.shape[1], "biases" in m) for m in modules}
        if len(same) != 1:
            return None
        shell = (first.group_size, 1)  # the smallest module of this quantization; its parameters are replaced
        fused = nn.QuantizedLinear(*shell, group_size=first.group_size, bits=first.bits, mode=first.mode)
        return _concat(fused, modules, ["weight", "scales"] + (["biases"] if "biases" in first else []))
    return None


def _concat(fused: nn.Module, modules: list[Any], names: list[str]) -> nn.Module | None:
    if len({m.weight.shape[1] for m in modules}) != 1 or len({"bias" in m for m in modules}) != 1:
        return None
    params = {name: mx.concatenate([m[name] for m in modules], axis=0) for name in names}
    if "bias" in modules[0]:
        params["bias"] = mx.concatenate([m["bias"] for m in modules], axis=0)
    elif "bias" in fused:
        del fused["bias"]
    fused.update(params)
    mx.eval(list(params.values()))
    return fused


def fuse(
    parent: Any, names: tuple[str, ...], wrap: Callable[[nn.Module], Linear] | None = None
) -> FusedLinears | None:
    """Replaces `parent`'s projections `names` by parts of one product; None where they cannot fuse
    (or already are). `wrap` may swap the fused module for a faster call of the same product."""
    modules = [getattr(parent, name, None) for name in names]
    if any(m is None or isinstance(m, _Part) for m in modules):
        return None
    linear = concat_linears(modules)
    if linear is None:
        return None
    sizes = [m.weight.shape[0] for m in modules]  # type: ignore[union-attr]  # concat_linears checked them
    fused = FusedLinears(wrap(linear) if wrap is not None else linear, sizes)
    for index, name in enumerate(names):
        setattr(parent, name, _Part(fused, index))
    return fused


def fused_products(model: nn.Module) -> list[Linear]:
    """The one product behind each group of fused projections under `model`, each once."""
    found: dict[int, Linear] = {}
    for _, module in model.named_modules():
        if isinstance(module, _Part):
            found.setdefault(id(module._fused), module._fused.linear)
    return list(found.values())


def fuse_gate_up(model: nn.Module, wrap: Callable[[nn.Module], Linear] | None = None) -> list[FusedLinears]:
    """Rewrites every fusable `layer.mlp` in place; returns the fused products (empty if none)."""
    layers = getattr(model, "layers", None) or []
    found = (fuse(layer.mlp, ("gate_proj", "up_proj"), wrap) for layer in layers if hasattr(layer, "mlp"))
    return [f for f in found if f is not None]


def fuse_qkv(model: nn.Module, wrap: Callable[[nn.Module], Linear] | None = None) -> list[FusedLinears]:
    """Rewrites every fusable `layer.self_attn`'s q, k and v in place; returns the fused products."""
    layers = getattr(model, "layers", None) or []
    found = (
        fuse(layer.self_attn, ("q_proj", "k_proj", "v_proj"), wrap)
        for layer in layers
        if hasattr(layer, "self_attn")
    )
    return [f for f in found if f is not None]
