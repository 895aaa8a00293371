"""Float32 weights of the C forward kept in a smaller form that holds every value exactly
(engine/runner/cpu/cpu_pack.h): bfloat16 words, 4-bit affine codes with a float32 scale and bias per
32 weights, or signed 8-bit codes with a float32 scale per 32 weights.

Owns the choice per weight and the first half of the load-time proof: a packing is kept only where the
kernel's own expansion gives every weight back bit for bit. The second half, the same logits bit for
bit from the packed and the float32 weights, is CpuDecode.same_logits's.

Why: a decode step of a few rows reads every weight once, so float32 weights make it a read of 4 bytes
per weight. A bfloat16 checkpoint served at float32 (the CPU's default dtype) holds 2 bytes of
information per weight, and a 4-bit model dequantized to float32 (the bundled SmolLM2, from llama.cpp's
Q4_1) about 5 bits. Read in those forms, the step reads 2x to 7x fewer bytes and computes the same
float32 products. The head counts too: every row of a step that needs logits reads all of it, and
llama.cpp's quantizations keep it (or the embedding it is tied to) in 8 bits (the bundled model's is
Q8_0, a fifth of a 16-row step's bytes as float32).
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from engine.runner.cpu import huge_pages
from engine.runner.cpu.matrix import Matrix

import numpy as np

_GROUP = 32  # the 4- and 8-bit packings' group: GGUF's block
_KINDS = {16: "bfloat16", 4: "4-bit affine", 8: "8-bit"}
_FIRST = 2  # weights[2] is the head (cpu_decode.c's list), then the layers


@dataclass(frozen=True)
class Packing:
    """What a model's layer weights became: the kernel's list, and a line for the load log."""

    weights: list[Matrix]
    kinds: Counter[str]  # "bfloat16", "4-bit affine" or "float32" (not packed), per layer weight

    @property
    def packed(self) -> bool:
        return any(kind in _KINDS.values() for kind in self.kinds.elements())

    def describe(self, before: list[Matrix]) -> str:
        read = sum(_nbytes(m) for m in self.weights[_FIRST:])
        was = sum(_nbytes(m) for m in before[_FIRST:])
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.kinds.items()))
        return f"head and layer weights {kinds}; {was / 2**20:.0f} MB read as {read / 2**20:.0f} MB"


def pack(lib: ctypes.CDLL, weights: list[Matrix], huge: bool = False, budget: int | None = None) -> Packing:
    """The kernel's weight list with every float32 matrix of the head and the layers (weights[2:],
    two-dimensional) that a smaller form holds exactly in that form; the embedding (of which a step
    reads a row per token) and the final norm stay as they are.
    `huge`: the packed arrays in one arena on 2 MB pages (huge_pages.py), read at every step.
    The float32 weights stay loaded (sgemm and MLX read them), so the packed copies are extra memory:
    at most `budget` bytes of them (default: a quarter of the memory available now); the weights
    past it stay float32 ("float32, no room")."""
    budget = memory_budget() if budget is None else budget
    out, kinds, used = list(weights[:_FIRST]), Counter[str](), 0
    for matrix in weights[_FIRST:]:
        if matrix.bits or matrix.arrays[0].ndim != 2:
            out.append(matrix)
            continue
        room = used + _smallest(matrix) <= budget
        packed = _packed(lib, matrix) if room else None
        if packed is not None and used + _nbytes(packed) > budget:  # past the budget
            packed, room = None, False
        used += _nbytes(packed) if packed is not None else 0
        kinds[_KINDS[packed.bits] if packed else "float32" if room else "float32, no room"] += 1
        out.append(packed or matrix)
    if huge:
        out = _gathered(out)
    return Packing(out, kinds)


def _gathered(weights: list[Matrix]) -> list[Matrix]:
    """The packed matrices' arrays moved into one arena on 2 MB pages."""
    packed = [m for m in weights if m.exact]
    copies = iter(huge_pages.gather([a for m in packed for a in m.arrays])[0])
    moved = {id(m): replace(m, arrays=tuple(next(copies) for _ in m.arrays)) for m in packed}
    return [moved.get(id(m), m) for m in weights]


_MEMORY_SHARE = 4  # the packed copies may take a quarter of the memory available at load


def memory_budget() -> int:
    """A quarter of the memory available now (Linux's MemAvailable); no limit where it is unknown."""
    try:
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable"))
    except (OSError, StopIteration):
        return 1 << 62
    return int(line.split()[1]) * 1024 // _MEMORY_SHARE


def _smallest(matrix: Matrix) -> int:
    """The fewest bytes a packing of `matrix` can take: 4-bit codes with a scale and bias per 32."""
    return matrix.arrays[0].size // 2 + matrix.arrays[0].size // 4


def _declare(lib: ctypes.CDLL) -> None:
    """The signatures of cpu_pack.h's exports."""
    lib.pack_affine4.restype = lib.pack_sym8.restype = lib.unpack_mismatches.restype = ctypes.c_size_t
    pointer, size = ctypes.c_void_p, ctypes.c_int
    lib.pack_affine4.argtypes = (pointer, size, size, pointer, pointer, pointer)
    lib.pack_sym8.argtypes = (pointer, size, size, pointer, pointer)
    lib.unpack_mismatches.argtypes = (pointer, pointer, pointer, size, size)


def _packed(lib: ctypes.CDLL, matrix: Matrix) -> Matrix | None:
    weight = matrix.arrays[0]
    bits = weight.view(np.uint32)
    packed: Matrix | None = None
    if not np.any(bits & 0xFFFF):
        packed = Matrix(((bits >> 16).astype(np.uint16),), 16, 0, exact=True, source=weight)
    elif weight.shape[1] % _GROUP == 0:
        packed = _affine4(lib, weight) or _sym8(lib, weight)
    return packed if packed is not None and _mismatches(lib, packed, weight) == 0 else None


def _affine4(lib: ctypes.CDLL, weight: np.ndarray) -> Matrix | None:
    rows, cols = weight.shape
    codes = np.empty((rows, cols // 8), np.uint32)
    scales, biases = (np.empty((rows, cols // _GROUP), np.float32) for _ in range(2))
    _declare(lib)
    pointers = (codes.ctypes.data, scales.ctypes.data, biases.ctypes.data)
    if lib.pack_affine4(weight.ctypes.data, rows, cols, *pointers):
        return None  # tried group by group: a weight no 4-bit group holds fails at its first
    return Matrix((codes, scales, biases), 4, _GROUP, exact=True, source=weight)


def _sym8(lib: ctypes.CDLL, weight: np.ndarray) -> Matrix | None:
    rows, cols = weight.shape
    codes, scales = np.empty((rows, cols // 4), np.uint32), np.empty((rows, cols // _GROUP), np.float32)
    _declare(lib)
    if lib.pack_sym8(weight.ctypes.data, rows, cols, codes.ctypes.data, scales.ctypes.data):
        return None
    return Matrix((codes, scales), 8, _GROUP, exact=True, source=weight)


def _mismatches(lib: ctypes.CDLL, packed: Matrix, weight: np.ndarray) -> int:
    """Rows of `weight` that the kernel's expansion of `packed` does not give back bit for bit."""
    _declare(lib)
    pointers = (ctypes.c_void_p * 4)(*packed.pointers)
    formats = np.array(packed.format, dtype=np.int32)
    rows, cols = weight.shape
    return int(lib.unpack_mismatches(pointers, formats.ctypes.data, weight.ctypes.data, rows, cols))


def _nbytes(matrix: Matrix) -> int:
    return sum(a.nbytes for a in matrix.arrays)
