"""The soak's observer: samples /v1/status and the replicas' RSS over time, waits for idle, fits slopes.

Owns what "nothing leaked" means here. The BlockPool counts a block as free when no request holds it,
prefix-cached blocks nobody references included (they sit, evictable, in its free queue), so
`num_blocks_used` is exactly the blocks held by live requests: at idle it must be 0 on every replica.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

import httpx

from bench.replica_procs import replica_pids, rss_mib

DEPLOYMENTS = ("Scheduler", "Ingress", "Tokenizer", "Embedder")


@dataclass
class Sample:
    t_s: float
    num_running: int
    num_waiting: int
    num_blocks_used: int
    num_blocks_total: int
    num_replicas: int
    rss_mib: dict[str, float]  # deployment -> summed RSS of its replicas
    mlx_active_mib: float  # MLX's allocated buffers over the Scheduler replicas (not its free-buffer cache)
    scheduler_rss_mib: dict[int, float] = field(default_factory=dict)  # pid -> RSS


async def status_total(client: httpx.AsyncClient) -> dict:
    response = await client.get("/v1/status")
    response.raise_for_status()
    return response.json()


def memory_by_deployment(app: str) -> tuple[dict[str, float], dict[int, float]]:
    by_deployment, scheduler = {}, {}
    for name in DEPLOYMENTS:
        total = 0.0
        for pid in replica_pids(app, name):
            rss = rss_mib(pid) or 0.0
            total += rss
            if name == "Scheduler":
                scheduler[pid] = rss
        by_deployment[name] = round(total, 1)
    return by_deployment, scheduler


async def take_sample(client: httpx.AsyncClient, app: str, started_s: float) -> Sample:
    status = await status_total(client)
    total = status["total"]
    by_deployment, scheduler = memory_by_deployment(app)
    return Sample(
        round(time.monotonic() - started_s, 1),
        total["num_running"],
        total["num_waiting"],
        total["num_blocks_used"],
        total["num_blocks_total"],
        status["num_replicas"],
        by_deployment,
        round(total["device_memory_bytes"] / 2**20, 1),
        scheduler,
    )


async def sample_until(
    client: httpx.AsyncClient, app: str, started_s: float, interval_s: float, stop: asyncio.Event
) -> list[Sample]:
    samples = []
    while not stop.is_set():
        try:
            samples.append(await take_sample(client, app, started_s))
        except httpx.HTTPError:
            pass  # a missed sample is a gap in the series, not a failure of the soak
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass
    return samples


async def wait_idle(client: httpx.AsyncClient, deadline_s: float) -> tuple[dict, float]:
    """Polls until no replica runs, queues or holds a block; returns the last total and the wait."""
    started = time.monotonic()
    total: dict = {}
    while time.monotonic() < started + deadline_s:
        status = await status_total(client)
        total = status["total"]
        if is_idle(status):
            break
        await asyncio.sleep(0.25)
    return total, round(time.monotonic() - started, 2)


def is_idle(status: dict) -> bool:
    rows = [status["total"], *status["replicas"]]
    return all(r["num_running"] == 0 and r["num_waiting"] == 0 and r["num_blocks_used"] == 0 for r in rows)


def slope_mib_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (m - mean_m) for t, m in points)
    return round(cov / var * 60.0, 3)


def memory_report(samples: list[Sample], warmup_s: float) -> dict:
    """Per deployment: RSS at the end of warm-up, at the end, the max, and the slope after warm-up;
    the same for the Scheduler's MLX active memory, which tells a growing buffer cache from a leak."""
    report = {}
    steady = [s for s in samples if s.t_s >= warmup_s]
    series = {name: [(s.t_s, s.rss_mib[name]) for s in steady if s.rss_mib.get(name)] for name in DEPLOYMENTS}
    series["Scheduler MLX active"] = [(s.t_s, s.mlx_active_mib) for s in steady]
    for name, points in series.items():
        if not points:
            continue
        report[name] = {
            "rss_after_warmup_mib": points[0][1],
            "rss_end_mib": points[-1][1],
            "rss_max_mib": max(m for _, m in points),
            "slope_mib_per_min": slope_mib_per_min(points),
            "num_points": len(points),
        }
    return report


def samples_json(samples: list[Sample]) -> list[dict]:
    return [
        asdict(s) | {"scheduler_rss_mib": {str(k): v for k, v in s.scheduler_rss_mib.items()}}
        for s in samples
    ]
