"""GET /metrics: aggregated engine stats in Prometheus' text format, under vLLM's metric names.

Owns the names, types, help texts and the exposition format, so that dashboards built for vLLM work
unchanged. Reads an `EngineStats` (already totalled over replicas by api/status.py); no Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.messages import EngineStats, Histogram

from api.status import kv_cache_usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM always exports these finish reasons, even at 0, so rate() sees the series from the start.
_FINISH_REASONS = ("stop", "length", "abort")

_GAUGES = {
    "vllm:num_requests_running": ("Number of requests in model execution batches.", "num_running"),
    "vllm:num_requests_waiting": ("Number of requests waiting to be processed.", "num_waiting"),
}
_COUNTERS = {
    "vllm:prompt_tokens": ("Number of prefill tokens processed.", "prompt_tokens_total"),
    "vllm:generation_tokens": ("Number of generation tokens processed.", "generation_tokens_total"),
    "vllm:prefix_cache_queries": (
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    "vllm:prefix_cache_hits": (
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hits",
    ),
    "vllm:num_preemptions": ("Cumulative number of preemptions from the engine.", "num_preemptions"),
    "vllm:mm_cache_queries": (
        "Multi-modal encoder cache queries, in requests with images.",
        "encoder_cache_queries",
    ),
    "vllm:mm_cache_hits": ("Multi-modal encoder cache hits, in requests with images.", "encoder_cache_hits"),
    "vllm:spec_decode_num_drafts": ("Number of spec decoding drafts.", "spec_num_drafts"),
    "vllm:spec_decode_num_draft_tokens": ("Number of draft tokens.", "spec_num_draft_tokens"),
    "vllm:spec_decode_num_accepted_tokens": ("Number of accepted tokens.", "spec_num_accepted_tokens"),
    # vLLM has no name for a disk tier under its own prefix cache: these are ours.
    "mlx_ray_serve:prefix_cache_disk_hits": (
        "Prefix cache hits read from the disk tier, in tokens (part of vllm:prefix_cache_hits).",
        "prefix_cache_disk_hits",
    ),
    "mlx_ray_serve:prefix_cache_disk_writes_dropped": (
        "KV blocks not written to the prefix cache's disk tier because its write queue was full.",
        "prefix_cache_disk_writes_dropped",
    ),
}
_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.",
        "time_to_first_token_s",
    ),
    "vllm:inter_token_latency_seconds": (
        "Histogram of inter-token latency in seconds.",
        "inter_token_latency_s",
    ),
    "vllm:e2e_request_latency_seconds": (
        "Histogram of e2e request latency in seconds.",
        "e2e_request_latency_s",
    ),
}


def render_metrics(models: list[tuple[str, EngineStats]]) -> str:
    """Every model's series under each metric's one HELP/TYPE header, told apart by `model_name`."""
    return "".join(_lines([(_labels(model_name=name), stats) for name, stats in models]))


def _lines(series: list[tuple[str, EngineStats]]) -> Iterator[str]:
    for name, (help_text, attr) in _GAUGES.items():
        yield from _header(name, "gauge", help_text)
        yield from (f"{name}{{{labels}}} {_number(getattr(stats, attr))}\n" for labels, stats in series)
    yield from _header("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
    for labels, stats in series:
        yield f"vllm:kv_cache_usage_perc{{{labels}}} {_number(kv_cache_usage(stats))}\n"
    for name, (help_text, attr) in _COUNTERS.items():
        yield from _header(f"{name}_total", "counter", help_text)
        yield from (f"{name}_total{{{labels}}} {_number(getattr(stats, attr))}\n" for labels, stats in series)
    yield from _accepted_per_pos(series)
    yield from _header("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for labels, stats in series:
        yield from _request_success(labels, stats.num_requests_by_finish_reason)
    for name, (help_text, attr) in _HISTOGRAMS.items():
        yield from _header(name, "histogram", help_text)
        for labels, stats in series:
            yield from _histogram(name, labels, getattr(stats, attr))


def _accepted_per_pos(series: list[tuple[str, EngineStats]]) -> Iterator[str]:
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    if not any(stats.spec_accepted_per_pos for _, stats in series):  # no model speculates
        return
    yield from _header(name, "counter", "Accepted tokens per draft's position.")
    for labels, stats in series:
        for position, count in enumerate(stats.spec_accepted_per_pos):
            yield f'{name}{{{labels},position="{position}"}} {count}\n'


def _request_success(labels: str, by_reason: dict[str, int]) -> Iterator[str]:
    for reason in sorted(set(_FINISH_REASONS) | by_reason.keys()):
        reason_label = _labels(finished_reason=reason)
        yield f"vllm:request_success_total{{{labels},{reason_label}}} {by_reason.get(reason, 0)}\n"


def _histogram(name: str, labels: str, histogram: Histogram) -> Iterator[str]:
    cumulative = 0
    for bound, count in zip(histogram.bounds, histogram.counts):
        cumulative += count
        yield f'{name}_bucket{{{labels},le="{_number(bound)}"}} {cumulative}\n'
    yield f'{name}_bucket{{{labels},le="+Inf"}} {histogram.count}\n'
    yield f"{name}_sum{{{labels}}} {_number(histogram.sum)}\n"
    yield f"{name}_count{{{labels}}} {histogram.count}\n"


def _header(name: str, kind: str, help_text: str) -> Iterator[str]:
    # Counters are typed under their `_total` name, as prometheus_client (and so vLLM) writes them.
    yield f"# HELP {name} {help_text}\n"
    yield f"# TYPE {name} {kind}\n"


def _labels(**labels: str) -> str:
    return ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)
