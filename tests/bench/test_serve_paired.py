"""bench/serve_paired.py's comparison: one client's turns by time per output token, a level of several
clients by output tok/s, and the first server's ratio to each per round with its median."""

from __future__ import annotations

from bench import serve_paired


def _turn(itl_ms: float, tok_s: float) -> dict:
    return {"itl_ms": itl_ms, "tok_s": tok_s}


ROUNDS = [
    {"round": 0, "ours": _turn(10.0, 190.0), "peer": _turn(25.0, 150.0)},
    {"round": 1, "ours": _turn(11.0, 180.0), "peer": _turn(22.0, 120.0)},
    {"round": 2, "ours": _turn(12.0, 200.0), "peer": _turn(24.0, 125.0)},
]


def test_several_clients_compare_output_tok_s_and_the_median_of_the_per_round_ratios():
    lines = serve_paired.table(["ours", "peer"], ROUNDS, concurrency=16).splitlines()
    assert "output tok/s, by round" in lines[0] and "ours tok/s / its tok/s" in lines[0]
    peer = next(line for line in lines if line.startswith("| peer |"))
    assert "150.0 / 120.0 / 125.0" in peer
    # per round 190/150, 180/120, 200/125: 1.27, 1.50, 1.60; their median, not the medians' ratio (1.52)
    assert "1.27 / 1.50 / 1.60, **1.50x**" in peer
    ours = next(line for line in lines if line.startswith("| ours |"))
    assert "**1.00x**" in ours


def test_one_client_compares_time_per_output_token():
    lines = serve_paired.table(["ours", "peer"], ROUNDS).splitlines()
    assert "ms per output token, by round" in lines[0] and "ours ITL / its ITL" in lines[0]
    peer = next(line for line in lines if line.startswith("| peer |"))
    assert "25.0 / 22.0 / 24.0" in peer
    assert "0.40 / 0.50 / 0.50, **0.50x**" in peer  # 10/25, 11/22, 12/24


def test_the_measure_follows_the_client_count():
    assert serve_paired.measure(1) == ("itl_ms", "ms per output token")
    assert serve_paired.measure(16) == ("tok_s", "output tok/s")
