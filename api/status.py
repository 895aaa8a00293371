"""The /v1/status JSON: engine stats of every Scheduler replica plus their totals.

Owns the aggregation rule (counters add up, histograms merge, `block_size` is shared, uptime is the
oldest replica's) and the derived rates; the ingress gathers the per-replica snapshots. No Ray, no MLX.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from engine.messages import EngineStats, Histogram

_HISTOGRAMS = ("time_to_first_token_s", "inter_token_latency_s", "e2e_request_latency_s")


def status_body(
    model: str,
    replicas: list[tuple[str, EngineStats]],
    errors: list[str],
    output_channels: dict[str, int] | None = None,
) -> dict[str, Any]:
    """`replicas` pairs each replica's id with its stats; `errors` lists replicas that did not answer;
    `output_channels`: the Ingress output channels open on each replica (one per Ingress replica
    that has streamed from it: its streams' outputs travel gathered)."""
    channels = output_channels or {}
    return {
        "model": model,
        "num_replicas": len(replicas),
        "total": stats_json(total_stats([stats for _, stats in replicas])),
        "replicas": [
            {"replica_id": replica_id, "output_channels": channels.get(replica_id, 0), **stats_json(stats)}
            for replica_id, stats in sorted(replicas, key=lambda r: r[0])
        ],
        "errors": errors,
    }


def total_stats(all_stats: list[EngineStats]) -> EngineStats:
    total = EngineStats()
    for stats in all_stats:
        for f in fields(EngineStats):
            mine, theirs = getattr(total, f.name), getattr(stats, f.name)
            setattr(total, f.name, _combine(f.name, mine, theirs))
    return total


def _combine(name: str, mine: Any, theirs: Any) -> Any:
    if name == "block_size":
        return mine or theirs
    if name == "uptime_s":
        return max(mine, theirs)
    if name == "compute":
        return None  # replicas may run different paths; each row shows its own
    if name == "spec_accepted_per_pos":  # per draft position: add up position by position
        width = max(len(mine), len(theirs))
        return [sum(x[i] for x in (mine, theirs) if i < len(x)) for i in range(width)]
    if isinstance(mine, Histogram):
        return mine.merged(theirs)
    if isinstance(mine, dict):
        return {key: mine.get(key, 0) + theirs.get(key, 0) for key in mine.keys() | theirs.keys()}
    return mine + theirs  # counters, gauges and the live-request lists


def stats_json(stats: EngineStats) -> dict[str, Any]:
    """The stats as JSON plus derived rates; histograms shrink to count and mean (/metrics has buckets)."""
    body = {k: v for k, v in asdict(stats).items() if k not in _HISTOGRAMS}
    if stats.compute is None:
        del body["compute"]
    body["kv_cache_usage"] = kv_cache_usage(stats)
    body["prefix_cache_hit_rate"] = (
        stats.prefix_cache_hits / stats.prefix_cache_queries if stats.prefix_cache_queries else None
    )
    body["spec_decode_acceptance_rate"] = (
        stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens if stats.spec_num_draft_tokens else None
    )
    body["latency"] = {name: _summary(getattr(stats, name)) for name in _HISTOGRAMS}
    return body


def kv_cache_usage(stats: EngineStats) -> float:
    """Fraction of KV blocks in use, 0..1 (what vLLM's kv_cache_usage_perc reports)."""
    return stats.num_blocks_used / stats.num_blocks_total if stats.num_blocks_total else 0.0


def _summary(histogram: Histogram) -> dict[str, Any]:
    count = histogram.count
    return {"count": count, "mean": histogram.sum / count if count else None}
