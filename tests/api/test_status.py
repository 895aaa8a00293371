"""The /v1/status totals add every replica's counters up."""

from __future__ import annotations

from dataclasses import replace

from engine.messages import ComputePaths, EngineStats, LiveRequestStats

from api.status import status_body, total_stats


def live(request_id: str) -> LiveRequestStats:
    return LiveRequestStats(request_id, "decode", 3, 2, 0, 0.1, 20.0)


def test_totals_add_counters_and_keep_block_size():
    a = EngineStats(
        num_running=2, num_blocks_total=100, num_blocks_used=10, block_size=16, live_requests=[live("a")]
    )
    b = EngineStats(
        num_running=1, num_blocks_total=100, num_blocks_used=5, block_size=16, live_requests=[live("b")]
    )
    total = total_stats([a, b])
    assert (total.num_running, total.num_blocks_total, total.num_blocks_used) == (3, 200, 15)
    assert total.block_size == 16
    assert [r.request_id for r in total.live_requests] == ["a", "b"]


def test_status_body_lists_replicas_and_errors():
    body = status_body(
        "smol", [("r2", EngineStats(num_waiting=1)), ("r1", EngineStats(num_waiting=2))], ["dead"]
    )
    assert body["num_replicas"] == 2 and body["total"]["num_waiting"] == 3
    assert [r["replica_id"] for r in body["replicas"]] == ["r1", "r2"]
    assert body["errors"] == ["dead"]


def test_status_derives_rates_and_keeps_the_oldest_uptime():
    a = EngineStats(
        num_blocks_total=10, num_blocks_used=5, prefix_cache_queries=8, prefix_cache_hits=2, uptime_s=9
    )
    b = EngineStats(num_blocks_total=10, num_blocks_used=0, prefix_cache_queries=0, uptime_s=3)
    total = status_body("smol", [("r1", a), ("r2", b)], [])["total"]
    assert total["kv_cache_usage"] == 0.25 and total["prefix_cache_hit_rate"] == 0.25
    assert total["uptime_s"] == 9
    assert total["latency"]["time_to_first_token_s"] == {"count": 0, "mean": None}


def test_each_replica_row_shows_its_compute_paths_and_the_total_none():
    config = "OpenBLAS 0.3.34 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"
    paths = {"attention": "gather", "math": "mlx", "prefill": "one_at_a_time", "kv_write": "the paged cache"}
    fast = ComputePaths("cpu", "float32", "openblas", "loaded", config, "Haswell", "c_forward", **paths)
    slow = ComputePaths("cpu", "float32", "reference", "no OpenBLAS", None, None, "mlx", **paths)
    slow = replace(slow, kv_cache_dtype="int8", kv_bytes_per_token=12960, kv_capacity_tokens=20704)
    body = status_body("smol", [("r1", EngineStats(compute=fast)), ("r2", EngineStats(compute=slow))], [])
    assert [r["compute"]["decode"] for r in body["replicas"]] == ["c_forward", "mlx"]
    assert body["replicas"][0]["compute"]["blas_core"] == "Haswell"
    assert body["replicas"][1]["compute"]["blas"] == "reference"
    kv = {
        k: body["replicas"][1]["compute"][k]
        for k in ("kv_cache_dtype", "kv_bytes_per_token", "kv_capacity_tokens")
    }
    assert kv == {"kv_cache_dtype": "int8", "kv_bytes_per_token": 12960, "kv_capacity_tokens": 20704}
    assert "compute" not in body["total"]
