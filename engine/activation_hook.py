"""Swaps mlx-lm's `swiglu` (silu(gate) * x) in a model's modules for engine/cpu_math.py's, whose
exp is built from fused multiply-adds: MLX's CPU sigmoid is scalar code.

Owns only that swap, done once per module and only where the module calls mlx-lm's own function
(other activations are left alone). Never reads weights or the KV cache.
"""

from __future__ import annotations

import sys

from engine import cpu_math

from mlx import nn
from mlx_lm.models import activations


def install(model: nn.Module) -> bool:
    """True when some layer's MLP module now calls cpu_math.swiglu."""
    layers = getattr(model, "layers", None) or getattr(getattr(model, "model", None), "layers", [])
    modules = {sys.modules.get(type(getattr(layer, "mlp", layer)).__module__) for layer in layers}
    patched = False
    for module in modules:
        if getattr(module, "swiglu", None) is activations.swiglu:
            module.swiglu = cpu_math.swiglu  # type: ignore[union-attr]
        patched = patched or getattr(module, "swiglu", None) is cpu_math.swiglu
    return patched
