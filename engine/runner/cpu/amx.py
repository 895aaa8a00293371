"""The C forward's many-row products of exact 4-bit weights on Intel AMX (engine/runner/cpu/cpu_amx.h).

Owns the AMX copies of the weights and the load-time decision to use them. The kernel is part of the
forward's own build (-march=native): on a CPU without AMX-BF16 (anything before Sapphire Rapids, every
AMD and Arm CPU) or a kernel that refuses a process AMX's state, nothing is packed and the products
stay oneDNN's or sgemm's, and the server says why (`compute.amx_matmul`).

At load, `choose` packs every layer weight that exact_pack.py holds as 4-bit codes (the bundled
SmolLM2's, from llama.cpp's Q4_1), checks that forwards through the copies give the same tokens as
forwards without them, with logits within float32 rounding (onednn.close_logits), and times whole
prefill-sized forwards both ways, alternating: the copies are kept only where they are faster on this
machine. They cost 2 bytes a weight (a bfloat16 code), half the float32 layers' size.
"""

from __future__ import annotations

import ctypes
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.runner.cpu import exact_pack, onednn
from engine.runner.cpu.matrix import Matrix, shapes_of

import numpy as np

logger = logging.getLogger(__name__)

# time_modes' answers in this process by the forward's build, weights' shapes and formats, direct rows
# and threads: a second engine of one shape reuses them instead of the timed forwards.
_TIMINGS: dict[tuple, dict[str, list[float]]] = {}
_MODES = ("amx", "without")  # prefill-sized forwards: the 32-row kernel, and the path it would replace
_FEW_MODES = ("few", "own")  # decode-sized forwards: the few-row kernel, and the own matmuls
NEVER = 1 << 30  # a few-row threshold no row count reaches: decode rows stay on the own matmuls


@dataclass
class Amx:
    """The AMX copies of one forward's 4-bit weights: one pointer per weight of the forward's list, None
    where it has none; freed with this object."""

    lib: ctypes.CDLL
    handles: ctypes.Array
    products: int  # weights with a copy
    nbytes: int

    def __post_init__(self) -> None:
        weakref.finalize(self, _free, self.lib, list(filter(None, self.handles)))


def _free(lib: ctypes.CDLL, handles: list[int]) -> None:
    for handle in handles:
        lib.amx_free(handle)


def declare(lib: ctypes.CDLL) -> None:
    """The signatures of cpu_amx.h's exports."""
    lib.amx_supported.restype = ctypes.c_int
    lib.amx_pack.restype = ctypes.c_void_p
    lib.amx_pack.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2
    lib.amx_free.argtypes = [ctypes.c_void_p]
    lib.amx_bytes.restype = ctypes.c_size_t
    lib.amx_bytes.argtypes = [ctypes.c_void_p]
    lib.amx_products.restype = ctypes.c_long
    lib.configure_amx.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.amx_multiply.restype = ctypes.c_int
    lib.amx_multiply.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2


def pack(lib: ctypes.CDLL, weights: list[Matrix]) -> Amx | str:
    """The AMX copy of every exact 4-bit layer weight of the forward's list, or why there is none."""
    declare(lib)
    if not lib.amx_supported():
        return "off (this CPU has no AMX-BF16, or the OS does not let the process use it)"
    candidates = [
        i for i, m in enumerate(weights) if i >= onednn.FIRST_LAYER_WEIGHT and m.exact and m.bits == 4
    ]
    if not candidates:
        return "off (no layer weight is held as exact 4-bit codes)"
    needed = sum(
        weights[i].shape[0] * weights[i].shape[1] * 5 // 2 for i in candidates
    )  # tiles of both kinds
    if needed > exact_pack.memory_budget():
        return (
            f"off (AMX's copies ({needed / 2**20:.0f} MiB) would take over a quarter of the memory available)"
        )
    handles = (ctypes.c_void_p * len(weights))()
    for i in candidates:
        codes, scales, biases = weights[i].arrays
        out, width = weights[i].shape
        handles[i] = lib.amx_pack(codes.ctypes.data, scales.ctypes.data, biases.ctypes.data, out, width)
    packed = [h for h in handles if h]
    if not packed:
        return "off (no 4-bit weight is whole 32x32 tiles)"
    return Amx(lib, handles, len(packed), sum(lib.amx_bytes(h) for h in packed))


class Forward(onednn.Forward, Protocol):
    """What `choose` needs of the C forward (engine/runner/cpu/cpu_decode.py's CpuDecode)."""

    amx: Amx | None  # the copies its 4-bit products read, or None
    amx_many: bool  # rows past the own matmuls' go to AMX
    amx_few_min: int  # decode rows from which the few-row kernel runs (NEVER: none)

    @property
    def library(self) -> ctypes.CDLL: ...


# Row counts whose decode forwards the load times with the few-row kernel and without: it takes the
# rows from the smallest of them where it is faster, and at every larger one, up to 16.
FEW_ROWS = (4, 8, 12, 16)


def choose(decode: Forward) -> tuple[Amx | None, bool, int, str]:
    """AMX copies of `decode`'s 4-bit weights where forwards through them give the same tokens (logits
    within float32 rounding) as forwards without them, with what they take: rows past the own matmuls'
    (prefill chunks) where that is faster here, and decode rows from the returned count up (NEVER:
    none) where the few-row kernel is; and what the status says of it."""
    began = time.perf_counter()
    packed = pack(decode.library, decode.matrices)
    if isinstance(packed, str):
        return None, False, NEVER, packed
    if not _agrees(decode, packed):
        logger.warning("C forward: AMX products changed the logits; not using them")
        return None, False, NEVER, "off (the AMX products' logits differed at load)"
    key = (
        decode.build,
        shapes_of(decode.matrices),
        decode.direct_rows,
        decode.threads,
        decode.onednn is None,
    )
    if key not in _TIMINGS:  # a second forward of one shape in this process reuses the first's
        _TIMINGS[key] = _time(decode, packed)
    timed = _TIMINGS[key]
    many = onednn.faster(timed, _MODES)
    faster = [rows for rows, one, two in zip(FEW_ROWS, timed["few"], timed["own"], strict=True) if one < two]
    few_min = next((r for r in FEW_ROWS if all(n in faster for n in FEW_ROWS if n >= r)), NEVER)
    prefill, steps = onednn.describe(timed, _MODES), onednn.describe(timed, _FEW_MODES, FEW_ROWS)
    if not many and few_min == NEVER:
        text = f"off (slower here: prefill {prefill}; decode {steps})"
        logger.info("C forward: AMX %s, decided in %.1f s", text, time.perf_counter() - began)
        return None, False, NEVER, text
    uses = [
        f"prefill ({prefill})" if many else f"not prefill (slower: {prefill})",
        f"decode steps of {few_min}-16 rows ({steps})" if few_min != NEVER else f"no decode rows ({steps})",
    ]
    text = (
        f"AMX bfloat16 x3 over {packed.products} 4-bit products ({packed.nbytes / 2**20:.0f} MiB of tiles): "
        + "; ".join(uses)
    )
    logger.info("C forward: %s, decided in %.1f s", text, time.perf_counter() - began)
    return packed, many, few_min, text


def _use(decode: Forward, packed: Amx | None, many: bool = True, few_min: int = NEVER) -> None:
    decode.amx, decode.amx_many, decode.amx_few_min = packed, many, few_min


def _agrees(decode: Forward, packed: Amx) -> bool:
    """Whether forwards (scratch pools) of a few row tiles, and of decode-sized row counts through the
    few-row kernel, give close_logits with and without AMX."""
    try:
        for rows, few_min in ((67, NEVER), (16, 1), (5, 1)):  # 67: three 32-row tiles, the last short
            _use(decode, None)
            without = decode.chunk_logits(rows)
            _use(decode, packed, True, few_min)
            if not onednn.close_logits(without, decode.chunk_logits(rows)):
                return False
        return True
    finally:
        _use(decode, None)


def _time(decode: Forward, packed: Amx) -> dict[str, list[float]]:
    """Fastest whole forwards on scratch pools, alternating: prefill-sized ones with and without the
    32-row kernel ("amx", "without"), decode-sized ones with the few-row kernel and with the own
    matmuls ("few", "own")."""
    timed = onednn.time_modes(
        lambda rows: _timer(decode, rows), lambda on: _use(decode, packed if on else None), _MODES
    )
    timed |= onednn.time_modes(
        lambda rows: _timer(decode, rows),
        lambda on: _use(decode, packed, False, 1 if on else NEVER),
        _FEW_MODES,
        FEW_ROWS,
    )
    _use(decode, None)
    return timed


def _timer(decode: Forward, rows: int) -> Callable[[], float]:
    forward = decode.scratch_forward(rows)
    return lambda: forward(decode.direct_rows)


def products(lib: ctypes.CDLL) -> int:
    """Products through AMX so far, in this process (the tests' evidence that the forward took it)."""
    declare(lib)
    return int(lib.amx_products())


def agreement(first: np.ndarray, second: np.ndarray) -> float:
    """The largest logit difference over the row's largest magnitude (bench/amx.py reports it)."""
    scale = np.abs(first).max(axis=1, keepdims=True)
    return float((np.abs(first - second) / scale).max())
