"""Fuses each MLP's gate and up projections into one matmul, for GPUs where every kernel launch counts.

Owns only the rewrite of already-loaded mlx-lm modules; the model's own code still runs unchanged:
`mlp.gate_proj(x)` and `mlp.up_proj(x)` become two halves of one `x @ [W_gate; W_up].T`, computed
once for the `x` both are called with. Plain `nn.Linear` layers without bias only; anything else
(quantized, biased, differently shaped) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx import nn


class _FusedPair:
    """One matmul for two projections of the same input; remembers the last input it saw."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, matmul_t: Callable[[mx.array, mx.array], mx.array]):
        self.weight = mx.concatenate([gate.weight, up.weight], axis=0)
        self.matmul_t = matmul_t
        self.split = gate.weight.shape[0]
        self._last: tuple[mx.array, mx.array, mx.array] | None = None

    def halves(self, x: mx.array) -> tuple[mx.array, mx.array]:
        if self._last is None or self._last[0] is not x:
            both = self.matmul_t(x, self.weight)
            self._last = (x, both[..., : self.split], both[..., self.split :])
        return self._last[1], self._last[2]


class _Half(nn.Module):
    def __init__(self, pair: _FusedPair, index: int):
        super().__init__()
        self._pair = pair
        self._index = index

    def __call__(self, x: mx.array) -> mx.array:
        return self._pair.halves(x)[self._index]


def _fusable(mlp: Any) -> bool:
    gate: Any = getattr(mlp, "gate_proj", None)
    up: Any = getattr(mlp, "up_proj", None)
    plain = all(type(m) is nn.Linear and "bias" not in m for m in (gate, up))
    return plain and gate.weight.shape[1] == up.weight.shape[1]


def _matmul_t(x: mx.array, weight: mx.array) -> mx.array:
    return x @ weight.T


def fuse_gate_up(model: nn.Module, matmul_t=_matmul_t) -> list[_FusedPair]:
    """Rewrites every fusable `layer.mlp` in place; returns the fused pairs (empty if none).
    `matmul_t(x, w)` computes x @ w.T (engine/runner/cuda/small_matmul.py passes its kernel on CUDA)."""
    layers = getattr(model, "layers", None) or []
    pairs = []
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not _fusable(mlp):
            continue
        pair = _FusedPair(mlp.gate_proj, mlp.up_proj, matmul_t)
        mlp.gate_proj, mlp.up_proj = _Half(pair, 0), _Half(pair, 1)
        pairs.append(pair)
    mx.eval([p.weight for p in pairs])
    return pairs
