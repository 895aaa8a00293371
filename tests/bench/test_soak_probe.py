"""The soak's verdicts: the memory slope fit, the idle check and the per-deployment memory report."""

from __future__ import annotations

from bench.soak_probe import Sample, is_idle, memory_report, slope_mib_per_min


def test_slope_is_mib_per_minute_and_needs_three_points():
    assert slope_mib_per_min([(0, 100.0), (60, 101.0), (120, 102.0)]) == 1.0
    assert slope_mib_per_min([(0, 100.0), (30, 100.0), (60, 100.0)]) == 0.0
    assert slope_mib_per_min([(0, 100.0), (60, 101.0)]) is None
    assert slope_mib_per_min([(5, 100.0), (5, 101.0), (5, 102.0)]) is None


def _row(running: int = 0, waiting: int = 0, used: int = 0) -> dict:
    return {"num_running": running, "num_waiting": waiting, "num_blocks_used": used}


def test_idle_needs_every_replica_idle_with_no_block_held():
    assert is_idle({"total": _row(), "replicas": [_row(), _row()]})
    assert not is_idle({"total": _row(), "replicas": [_row(), _row(used=1)]})
    assert not is_idle({"total": _row(waiting=1), "replicas": [_row()]})


def test_memory_report_ignores_warmup_and_fits_each_deployment():
    samples = [
        Sample(t, 0, 0, 0, 10, 1, {"Scheduler": 1000.0 + (50 if t < 60 else t / 60), "Ingress": 200.0}, 500.0)
        for t in range(0, 600, 5)
    ]
    report = memory_report(samples, warmup_s=60)
    assert report["Scheduler"]["slope_mib_per_min"] == 1.0  # the warm-up jump is left out
    assert report["Scheduler"]["rss_after_warmup_mib"] == 1001.0
    assert report["Ingress"]["slope_mib_per_min"] == 0.0
    assert report["Scheduler MLX active"]["rss_end_mib"] == 500.0
    assert "Embedder" not in report  # no replica sampled: no row
