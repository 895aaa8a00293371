"""The /v1/status JSON: engine stats of every Scheduler replica plus their totals.

Owns the aggregation rule only (counters add up; `block_size` is shared); the ingress gathers the
per-replica snapshots. No Ray, no MLX.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from engine.messages import EngineStats

_NOT_SUMMED = {"block_size", "live_requests"}


def status_body(model: str, replicas: list[tuple[str, EngineStats]], errors: list[str]) -> dict[str, Any]:
    """`replicas` pairs each replica's id with its stats; `errors` lists replicas that did not answer."""
    return {
        "model": model,
        "num_replicas": len(replicas),
        "total": asdict(total_stats([stats for _, stats in replicas])),
        "replicas": [
            {"replica_id": replica_id, **asdict(stats)}
            for replica_id, stats in sorted(replicas, key=lambda r: r[0])
        ],
        "errors": errors,
    }


def total_stats(all_stats: list[EngineStats]) -> EngineStats:
    total = EngineStats()
    for stats in all_stats:
        for f in fields(EngineStats):
            if f.name not in _NOT_SUMMED:
                setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
        total.block_size = total.block_size or stats.block_size
        total.live_requests.extend(stats.live_requests)
    return total
