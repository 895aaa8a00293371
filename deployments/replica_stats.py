"""Gathers the engine stats of every Scheduler replica, for /v1/status and /metrics.

Owns the broadcast call only; api/status.py adds the snapshots up and api/metrics.py renders them.
"""

from __future__ import annotations

from deployments.messages import ReplicaStats
from deployments.watched_handle import WatchedHandle


async def gather_stats(scheduler: WatchedHandle, timeout_s: float) -> tuple[list[ReplicaStats], list[str]]:
    """The stats of every replica that answered, and an error line for each that did not.
    `broadcast` calls each running replica once; a plain handle call would reach one replica only."""
    response = scheduler.broadcast("stats")
    results = await response.results_async(timeout_s=timeout_s, return_exceptions=True)
    replicas = [r for r in results if isinstance(r, ReplicaStats)]
    errors = [f"{type(r).__name__}: {r}" for r in results if not isinstance(r, ReplicaStats)]
    return replicas, errors
