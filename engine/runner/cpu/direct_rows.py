"""Which row counts of the C forward take its own matmuls and which OpenBLAS's, measured at load.

The own matmuls read each weight once for every row (engine/runner/cpu/cpu_matmul.h); OpenBLAS's
sgemv/sgemm copy (pack) a float32 weight first, or multiply tiles of dequantized quantized ones. Where
the two cross depends on the CPU's vector width, its cores, its memory and the BLAS, and a matmul timed
alone misses what OpenBLAS's threads and the kernel's cost each other inside a forward: whole forwards
are timed, the two modes alternating, on scratch pools (engine/runner/cpu/cpu_decode.py's
`scratch_forward`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

# The measurement starts no new row count after this long.
MEASURE_BUDGET_S = 5.0
# A row count where the own matmuls are at most this much slower than OpenBLAS's does not end the
# measurement: timing noise between two memory-bound forwards is of this order.
DIRECT_TIE = 0.05
# A row count that would end the measurement is timed this many more times first: a busy moment (the
# server's other processes starting beside this one) once made the own matmuls look 2x slower at 4
# rows for three forwards, and sent every decode step of 4 to 32 rows to OpenBLAS.
CONFIRM_REPS = 5

# scratch_forward(rows) -> forward(direct_rows) -> seconds: one whole forward of `rows` rows, with the
# own matmuls for up to direct_rows rows (0: OpenBLAS's).
ScratchForward = Callable[[int], Callable[[int], float]]


def measure_direct_rows(scratch_forward: ScratchForward, max_direct: int) -> tuple[int, int]:
    """(direct_min, direct_rows): the row counts whose forwards are faster with the own matmuls. Walks
    up the row counts and stops at the first where the own matmuls are clearly slower, timed twice."""
    measured: dict[int, tuple[float, float]] = {}
    began = time.perf_counter()
    for rows in (1, 2, 4, 8, 16, max_direct):
        if time.perf_counter() - began > MEASURE_BUDGET_S:  # a large model: keep what was shown
            break
        forward = scratch_forward(rows)
        own, blas = _time_rows(forward, rows, 3)
        if _clearly_slower(own, blas):  # it would end the walk: not on one busy moment's word
            again = _time_rows(forward, rows, CONFIRM_REPS)
            own, blas = min(own, again[0]), min(blas, again[1])
        measured[rows] = (own, blas)
        logger.debug(
            "C forward: %d rows, own matmuls %.1f ms, OpenBLAS's %.1f ms", rows, own * 1e3, blas * 1e3
        )
        if rows > 1 and _clearly_slower(own, blas):  # pick_direct_rows stops there too
            break
    lowest, best = pick_direct_rows(measured)
    logger.info("C forward: its own matmuls from %d to %d rows, OpenBLAS's for the others", lowest, best)
    return lowest, best


def _time_rows(forward: Callable[[int], float], rows: int, reps: int) -> tuple[float, float]:
    """The fastest of `reps` forwards with the own matmuls and with OpenBLAS's, alternating."""
    times: list[list[float]] = [[], []]
    for _ in range(reps):
        for mode, direct in enumerate((rows, 0)):
            times[mode].append(forward(direct))
    return min(times[0]), min(times[1])


def _clearly_slower(own: float, blas: float) -> bool:
    return own > blas * (1 + DIRECT_TIE)


def pick_direct_rows(measured: dict[int, tuple[float, float]]) -> tuple[int, int]:
    """From (own, OpenBLAS) forward seconds at each row count: (direct_min, direct_rows), the row counts
    whose matmuls are the kernel's own. One row is memory-bound in both modes and decided alone: the own
    matmuls unless sgemv is more than DIRECT_TIE faster, since served, the server's other processes
    preempt a worker now and then, and the own matmuls' other worker takes over its channels where
    sgemv's split waits for it (a single f32 stream over HTTP: 19.1-21.9 against 25.2-26.5 ms a token,
    docs/benchmarks.md). Past it, the largest count where the own matmuls are faster, with every count
    between at most DIRECT_TIE slower: a near tie at a few rows must not send the rows where the own
    matmuls win by a third (16 on a 2-core AVX-512 machine) to OpenBLAS. (1, 0): none."""
    one = 1 in measured and not _clearly_slower(*measured[1])
    best = 1 if one else 0
    for rows in sorted(r for r in measured if r > 1):
        own, blas = measured[rows]
        if _clearly_slower(own, blas):
            break
        if own <= blas:
            best = rows
    return (1 if one or best == 0 else 2), best
