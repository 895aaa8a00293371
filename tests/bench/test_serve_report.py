"""How the serving benchmark records its --out path in results that get committed."""

from __future__ import annotations

from pathlib import Path

from bench.serve_report import recorded_out


def test_out_inside_the_checkout_or_home_is_kept_and_a_scratch_path_becomes_its_file_name():
    repo = Path.home() / "checkout"
    assert recorded_out("bench/results/serve.json", repo) == "bench/results/serve.json"
    assert recorded_out(str(repo / "bench/results/x.json"), repo) == str(repo / "bench/results/x.json")
    assert recorded_out(str(Path.home() / "runs/a.json"), repo) == str(Path.home() / "runs/a.json")
    scratch = Path("/nonexistent-scratch/pairs/p2.json")  # outside both, whatever HOME is
    assert recorded_out(str(scratch), repo) == "p2.json"
