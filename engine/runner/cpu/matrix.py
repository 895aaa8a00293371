"""One weight as the C forward (engine/runner/cpu/cpu_decode.c) reads it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Matrix:
    """float32 data (bits 0), or MLX's affine codes (uint32 words) with float32 scales and biases per
    `group` weights. `exact`: float32 weights kept in a form that holds them exactly
    (engine/runner/cpu/exact_pack.py): bfloat16 words (bits 16, uint16), 4-bit affine codes, or signed
    8-bit codes (int8 bytes in uint32 words) with scales and no biases."""

    arrays: tuple[np.ndarray, ...]
    bits: int = 0
    group: int = 0
    exact: bool = False
    source: np.ndarray | None = None  # an exact packing's float32 weights, which sgemm reads

    @property
    def pointers(self) -> tuple[int | None, ...]:
        """The four pointers the kernel reads a weight by (cpu_decode.c's weight_at)."""
        data = tuple(a.ctypes.data for a in self.arrays) + (None,) * (3 - len(self.arrays))
        return (*data, None if self.source is None else self.source.ctypes.data)

    @property
    def format(self) -> tuple[int, int]:
        """(bits, group) as the kernel reads them: bits below 0 mark an exact packing."""
        return -self.bits if self.exact else self.bits, self.group

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) in weights."""
        rows, cols = self.arrays[0].shape
        return rows, cols * self.arrays[0].itemsize * 8 // self.bits if self.bits else cols


def shapes_of(matrices: list[Matrix]) -> tuple:
    """What forwards over `matrices` take on one machine depends on, as a key: each weight's array shapes
    and format, and whether it stands for float32 weights sgemm reads; not the weights' values."""
    return tuple((tuple(a.shape for a in m.arrays), m.format, m.source is not None) for m in matrices)
