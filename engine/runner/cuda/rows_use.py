"""Which of a model's few-row products a CUDA decode path gives to the project's own kernels: 4-bit ones
to quantized_rows.py, bf16 ones to small_matmul.py (2 to 4 rows) and bf16_rows.py (5 to 128 rows).

Owns the choice, the per-shape load-time check results and the count for `/v1/status`; never changes
a product the kernels' checks did not pass, and never touches the model's other modules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.runner.cuda import bf16_rows, quantized_rows
from engine.runner.cuda.fused_projections import fused_products
from engine.runner.cuda.small_matmul import SmallRowsLinear, small_rows

from mlx import nn

logger = logging.getLogger(__name__)


class _Kind:
    """One kernel's bookkeeping: its setting, the wrappers it made, the layers it left to MLX and why."""

    def __init__(
        self, name: str, setting: str, on: bool, wrapper: type, check: Callable[[nn.Module], str | None]
    ):
        self.name, self.setting, self.on, self.wrapper, self._check = name, setting, on, wrapper, check
        self.taken: set[int] = set()  # ids of this kernel's wrappers serving this build's model
        self.kept: dict[str, int] = {}  # why a layer keeps MLX's product -> how many
        self._checked: dict[tuple[int, ...], str | None] = {}  # per weight shape (and group size)

    def take(self, linear: nn.Module, refusal: str | None, key: tuple[int, ...]) -> nn.Module:
        if refusal is None:
            if key not in self._checked:
                self._checked[key] = self._check(linear)
            refusal = self._checked[key]
        if refusal is not None:
            self.kept[refusal] = self.kept.get(refusal, 0) + 1
            logger.warning("%s rows kernel not used for a %s layer: %s", self.name, key[:2], refusal)
            return linear
        fast = self.wrapper(linear)
        self.taken.add(id(fast))
        return fast

    @property
    def summary(self) -> str:
        if not self.on:
            return f"{self.name} off (engine.{self.setting} is false)"
        total = len(self.taken) + sum(self.kept.values())
        if total == 0:
            return ""
        kept = "".join(f"; {n} keep MLX's: {reason}" for reason, n in self.kept.items())
        return f"{len(self.taken)} of {total} {self.name} products{kept}"


class RowsKernels:
    """The wrap a CUDA decode path builds its products with (the fusions' `wrap`, and `rewrite` for the
    others). `quantized`/`bf16`: engine.cuda_quantized_rows / engine.cuda_bf16_rows."""

    def __init__(self, quantized: bool, bf16: bool):
        self.quantized = _Kind(
            "4-bit",
            "cuda_quantized_rows",
            quantized,
            quantized_rows.QuantizedRowsLinear,
            quantized_rows.check,
        )
        self.bf16 = _Kind("bf16", "cuda_bf16_rows", bf16, bf16_rows.Bf16RowsLinear, bf16_rows.check)

    def __call__(self, linear: nn.Module) -> nn.Module:
        return self.take(small_rows(linear))

    def take(self, linear: nn.Module) -> nn.Module:
        """`linear` itself, or the same product through one of the kernels."""
        if type(linear) is nn.QuantizedLinear:
            if not self.quantized.on:
                return linear
            key = (linear.weight.shape[0], linear.weight.shape[1], linear.group_size)
            return self.quantized.take(linear, quantized_rows.refusal(linear), key)
        if not self.bf16.on or type(small := small_rows(linear)) is not SmallRowsLinear:
            return linear
        return self.bf16.take(small, bf16_rows.refusal(small), tuple(small.weight.shape))

    @property
    def num_taken(self) -> int:
        return len(self.quantized.taken) + len(self.bf16.taken)

    def rewrite(self, model: nn.Module) -> None:
        """Takes every projection under `model` that is a module's child (or in its list), and counts the
        kernels' wrappers already there (a path built before this one may have made them)."""
        wrappers = {kind.wrapper: kind for kind in (self.quantized, self.bf16)}
        for module in [*fused_products(model), *(m for _, m in model.named_modules())]:
            if (kind := wrappers.get(type(module))) is not None:
                kind.taken.add(id(module))
        for _, module in list(model.named_modules()):
            if type(module) in wrappers:
                continue
            for name, child in list(module.children().items()):
                if isinstance(child, nn.Module) and (fast := self.take(child)) is not child:
                    setattr(module, name, fast)
                elif isinstance(child, list):  # e.g. nn.Sequential's layers (children() lists a copy)
                    items = module[name]
                    for i, item in enumerate(items):
                        if isinstance(item, nn.Module) and (fast := self.take(item)) is not item:
                            items[i] = fast

    @property
    def summary(self) -> str:
        parts = [s for s in (self.quantized.summary, self.bf16.summary) if s]
        return "; ".join(parts) or "no few-row products"
