"""Edits of the random weights a builder has saved, for tiny models that would otherwise ignore
their picture or prompt: all-zero weights given random values, gates set to a value, weights
multiplied or redrawn."""

from __future__ import annotations

from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)

import mlx.core as mx

MOE_ROUTER = "mlp.gate.weight"


def randomize_zero_weights(out: Path, seed: int, key_part: str) -> None:
    """Gives random values (uniform in +-1/sqrt(fan_in), like nn.Linear) to the all-zero weights whose
    name contains `key_part`. Some model classes create a weight with mx.zeros: a patch embedding (which
    would cut the pixels off from the output) or a MoE router (every token would tie on every expert)."""
    path = str(out / "model.safetensors")
    weights = mx.load(path)
    mx.random.seed(seed + 1)
    for name, value in weights.items():
        if key_part in name and value.ndim >= 2 and not mx.any(value).item():
            bound = (value.size // value.shape[0]) ** -0.5
            weights[name] = mx.random.uniform(-bound, bound, value.shape, value.dtype)
    mx.save_safetensors(path, weights, metadata={"format": "mlx"})


def set_weights(out: Path, value: float, suffixes: tuple[str, ...]) -> None:
    """Sets every saved weight whose name ends with one of `suffixes` to `value` (e.g. tanh gates
    that the model initializes to zero, which would keep the image out of the output)."""
    path = str(out / "model.safetensors")
    weights = mx.load(path)
    for name, weight in weights.items():
        if name.endswith(suffixes):
            weights[name] = mx.full(weight.shape, value, weight.dtype)
    mx.save_safetensors(path, weights, metadata={"format": "mlx"})


def rescale(out: Path, factors: dict[str, float]) -> None:
    """Multiplies the saved weights whose names contain a key of `factors`. A tiny random model can
    ignore its input (std-0.02 embeddings under constant biases) or its picture (hundreds of image
    tokens averaged by flat attention); scaling the drawn weights brings both back."""
    path = str(out / "model.safetensors")
    weights = mx.load(path)
    for name, value in weights.items():
        for part, factor in factors.items():
            if part in name:
                weights[name] = value * factor
    mx.save_safetensors(path, weights, metadata={"format": "mlx"})


def redraw(out: Path, parts: list[str], seed: int, std: float = 1.0) -> None:
    """Redraws as normal(0, std) the saved weights whose names contain one of `parts`: some classes
    initialize their token embeddings to zeros, which makes every prompt look the same."""
    path = str(out / "model.safetensors")
    weights = mx.load(path)
    key = mx.random.key(seed)
    for name, value in weights.items():
        if any(part in name for part in parts):
            key, sub = mx.random.split(key)
            weights[name] = (mx.random.normal(value.shape, key=sub) * std).astype(value.dtype)
    mx.save_safetensors(path, weights, metadata={"format": "mlx"})
