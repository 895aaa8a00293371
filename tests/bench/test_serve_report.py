"""Committed benchmark results name their --out file without any machine's scratch paths."""

from __future__ import annotations

from pathlib import Path

from bench.serve_report import recorded_out

REPO = Path("/checkout/mlx-ray-serve")


def test_an_out_inside_the_checkout_stays_relative():
    assert recorded_out("bench/results/serve.json", REPO) == "bench/results/serve.json"
    assert recorded_out(f"{REPO}/bench/results/serve.json", REPO) == "bench/results/serve.json"


def test_an_out_elsewhere_keeps_only_its_file_name():
    assert recorded_out("/tmp/exp/pairs/p1.json", REPO) == "p1.json"
    assert recorded_out("../elsewhere/p2.json", REPO) == "p2.json"
