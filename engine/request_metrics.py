"""Per-request latency histograms and finish counts, recorded by the engine as tokens and finishes happen.

Owns the histograms and their bucket bounds (vLLM's, so that dashboards built for vLLM read them the
same way); reads a request's timestamps, never changes the request. `snapshot` hands out copies.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import replace

from engine.core.request import Request
from engine.messages import Histogram

# vLLM v1's buckets (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BOUNDS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL_BOUNDS_S = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0]  # fmt: skip
E2E_BOUNDS_S = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


def new_histogram(bounds: list[float]) -> Histogram:
    return Histogram(list(bounds), [0] * (len(bounds) + 1), 0.0)


def observe(histogram: Histogram, value: float) -> None:
    # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus `le`).
    histogram.counts[bisect.bisect_left(histogram.bounds, value)] += 1
    histogram.sum += value


class RequestMetrics:
    def __init__(self) -> None:
        self.time_to_first_token_s = new_histogram(TTFT_BOUNDS_S)
        self.inter_token_latency_s = new_histogram(ITL_BOUNDS_S)
        self.e2e_request_latency_s = new_histogram(E2E_BOUNDS_S)
        self.num_by_finish_reason: dict[str, int] = {}

    def on_token(self, request: Request) -> None:
        """Call after a request got a new output token."""
        if request.num_output_tokens == 1 and request.first_token_s is not None:
            observe(self.time_to_first_token_s, request.first_token_s - request.arrival_s)
        elif request.token_gap_s is not None:
            observe(self.inter_token_latency_s, request.token_gap_s)

    def on_finish(self, request: Request) -> None:
        """Call once per request that leaves the engine, whatever the reason."""
        observe(self.e2e_request_latency_s, time.monotonic() - request.arrival_s)
        reason = request.finish_reason or "abort"
        self.num_by_finish_reason[reason] = self.num_by_finish_reason.get(reason, 0) + 1

    def snapshot(self) -> tuple[Histogram, Histogram, Histogram, dict[str, int]]:
        def copy(h: Histogram) -> Histogram:
            return replace(h, bounds=list(h.bounds), counts=list(h.counts))

        return (
            copy(self.time_to_first_token_s),
            copy(self.inter_token_latency_s),
            copy(self.e2e_request_latency_s),
            dict(self.num_by_finish_reason),
        )
