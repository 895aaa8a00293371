"""The load-time choice between the C forward's own matmuls and OpenBLAS's (engine/runner/cpu/direct_rows.py),
from given timings: pure logic, no kernel."""

from __future__ import annotations

from engine.runner.cpu import direct_rows

import pytest


@pytest.mark.parametrize(
    "measured, expected",
    [
        # One row a near tie (memory-bound in both modes, and served the own matmuls share work better),
        # 16 rows a clear win: the own matmuls from 1 to 16.
        ({1: (12.4, 12.3), 2: (13.0, 14.0), 16: (25.9, 36.1), 32: (60.0, 50.0)}, (1, 16)),
        ({1: (12.0, 12.3), 2: (13.0, 14.0), 16: (25.9, 36.1), 32: (60.0, 50.0)}, (1, 16)),
        ({1: (13.0, 12.3), 2: (13.0, 14.0), 16: (25.9, 36.1)}, (2, 16)),  # sgemv 6% faster at one row
        # sgemv 10% faster at one row, the own tiles faster from 2 rows on: one row alone to OpenBLAS.
        ({1: (15.3, 14.0), 2: (15.0, 16.0), 4: (16.5, 16.0), 8: (18.0, 25.0)}, (2, 8)),
        ({1: (10.0, 12.0), 2: (10.0, 9.0), 4: (5.0, 9.0)}, (1, 1)),  # 2 rows 11% slower: the walk ends
        ({1: (14.0, 12.0), 2: (20.0, 15.0)}, (1, 0)),  # OpenBLAS's for every count
        ({1: (12.1, 12.0)}, (1, 1)),
        ({1: (12.7, 12.0)}, (1, 0)),
    ],
)
def test_direct_rows_are_where_the_own_matmuls_win_past_near_ties(measured, expected):
    assert direct_rows.pick_direct_rows(measured) == expected


def _timed_forwards(ms: dict[int, tuple[float, float]], busy: int) -> direct_rows.ScratchForward:
    """Forwards that take ms[rows] (own, OpenBLAS) milliseconds, except the first `busy` own forwards
    at 4 rows, which take 3x as long (a busy moment)."""
    slow = {"left": busy}

    def scratch_forward(rows: int):
        def forward(direct_rows: int) -> float:
            own, blas = ms[rows]
            if direct_rows and rows == 4 and slow["left"] > 0:
                slow["left"] -= 1
                return 3 * own / 1e3
            return (own if direct_rows else blas) / 1e3

        return forward

    return scratch_forward


# The own matmuls faster at every count but 32, where they lose by a third.
TIMINGS = {
    1: (12.0, 12.5),
    2: (12.5, 20.0),
    4: (13.0, 24.0),
    8: (15.0, 26.0),
    16: (22.0, 33.0),
    32: (60.0, 40.0),
}


@pytest.mark.parametrize(
    ("busy", "expected"), [(0, (1, 16)), (3, (1, 16)), (3 + direct_rows.CONFIRM_REPS, (1, 2))]
)
def test_one_busy_moment_does_not_send_decode_rows_to_openblas(busy, expected):
    # 3 slow forwards at 4 rows: the count is timed again before the walk would end there, and the own
    # matmuls keep 4 to 16 rows. Slow in the second timing too, the walk ends (the measurement trusts
    # what it sees twice).
    assert direct_rows.measure_direct_rows(_timed_forwards(TIMINGS, busy), 32) == expected
