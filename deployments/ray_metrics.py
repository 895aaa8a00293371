"""Exports one Scheduler replica's engine stats through Ray's metrics (ray.util.metrics), so Ray's
Prometheus endpoint and dashboard show them next to Ray Serve's own.

Owns the Ray metric objects and the last exported counter values (Ray counters take increments,
the engine reports totals). Names are vLLM's with ':' made '_' (Ray refuses ':'), tagged with
model_name and ReplicaId as vLLM's Ray stat logger does; Ray prefixes them with `ray_`.
Histograms are on the Ingress's /metrics only: a snapshot's buckets cannot be replayed as observations.
"""

from __future__ import annotations

from engine.messages import EngineStats

from ray.util.metrics import Counter, Gauge

from api.status import kv_cache_usage

_TAGS = ("model_name", "ReplicaId")
_COUNTERS = {
    "vllm_prompt_tokens": "prompt_tokens_total",
    "vllm_generation_tokens": "generation_tokens_total",
    "vllm_prefix_cache_queries": "prefix_cache_queries",
    "vllm_prefix_cache_hits": "prefix_cache_hits",
    "vllm_num_preemptions": "num_preemptions",
    "vllm_mm_cache_queries": "encoder_cache_queries",
    "vllm_mm_cache_hits": "encoder_cache_hits",
}


class RayMetricsExporter:
    def __init__(self, model_name: str, replica_id: str):
        tags = {"model_name": model_name, "ReplicaId": replica_id}
        self._running = Gauge("vllm_num_requests_running", "Requests in model execution batches.", _TAGS)
        self._waiting = Gauge("vllm_num_requests_waiting", "Requests waiting to be processed.", _TAGS)
        self._kv_usage = Gauge("vllm_kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", _TAGS)
        self._counters = {name: Counter(name, f"vLLM's {name}.", _TAGS) for name in _COUNTERS}
        self._success = Counter("vllm_request_success", "Finished requests.", (*_TAGS, "finished_reason"))
        for metric in (self._running, self._waiting, self._kv_usage, self._success, *self._counters.values()):
            metric.set_default_tags(tags)
        self._last: dict[str, float] = {}

    def export(self, stats: EngineStats) -> None:
        self._running.set(stats.num_running)
        self._waiting.set(stats.num_waiting)
        self._kv_usage.set(kv_cache_usage(stats))
        for name, attr in _COUNTERS.items():
            self._increment(self._counters[name], name, getattr(stats, attr))
        for reason, total in stats.num_requests_by_finish_reason.items():
            self._increment(self._success, f"success:{reason}", total, {"finished_reason": reason})

    def _increment(
        self, counter: Counter, key: str, total: float, tags: dict[str, str] | None = None
    ) -> None:
        delta = total - self._last.get(key, 0)
        if delta > 0:
            counter.inc(delta, tags)
        self._last[key] = total
