"""Swaps mlx-lm's `swiglu` (silu(gate) * x) in a model's modules for engine/runner/cpu/cpu_math.py's, whose
exp is built from fused multiply-adds: MLX's CPU sigmoid is scalar code. Also the `cpu_math` plug-in
(engine/runner/fast_path.py) that turns on that swap and cpu_math's attention for prefill chunks.

Owns only that swap, done once per module and only where the module calls mlx-lm's own function
(other activations are left alone). Never reads weights or the KV cache.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType

from engine.runner import attention_hook
from engine.runner.cpu import cpu_math
from engine.runner.fast_path import Target, cache_refusal

from mlx import nn
from mlx_lm.models import activations
from mlx_lm.models.cache import KVCache, RotatingKVCache


class CpuMath:
    """Softmax and SwiGLU on cpu_math's exp: prefill attention through the attention hook, the MLP's
    activation through the swap above."""

    name = "cpu_math"
    role = "math"
    setting = "cpu_math"
    devices: tuple[str, ...] = ("cpu",)

    def applies(self, target: Target) -> str | None:
        # MLX operations: they run on any device, and pay off where MLX's exp is scalar. Windows are
        # fine: its attention takes the mask each layer asks its cache for, windowed or not (checked
        # against mlx-lm in tests/engine/test_windowed_models.py); other cache kinds are not checked.
        return cache_refusal(target.model, handles=(KVCache, RotatingKVCache))

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[object | None, str | None]:
        attention_hook.install(target.model)
        install(target.model)
        return cpu_math, None


def install(model: nn.Module) -> bool:
    """True when some layer's MLP module now calls cpu_math.swiglu."""
    patched = False
    for module in _mlp_modules(model):
        if getattr(module, "swiglu", None) is activations.swiglu:
            module.swiglu = cpu_math.swiglu  # type: ignore[attr-defined]
        patched = patched or getattr(module, "swiglu", None) is cpu_math.swiglu
    return patched


@contextmanager
def stock(model: nn.Module) -> Iterator[None]:
    """mlx-lm's own swiglu for the duration: benchmarks run mlx-lm's generators on the same model
    object, and must measure them as shipped."""
    swapped = [m for m in _mlp_modules(model) if getattr(m, "swiglu", None) is cpu_math.swiglu]
    for module in swapped:
        module.swiglu = activations.swiglu  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in swapped:
            module.swiglu = cpu_math.swiglu  # type: ignore[attr-defined]


def _mlp_modules(model: nn.Module) -> set[ModuleType]:
    layers = getattr(model, "layers", None) or getattr(getattr(model, "model", None), "layers", [])
    modules = {sys.modules.get(type(getattr(layer, "mlp", layer)).__module__) for layer in layers}
    return {m for m in modules if m is not None}
