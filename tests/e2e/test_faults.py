"""Replica processes killed under load: clean errors for what was in flight, then Ray Serve recovers.

Each test SIGKILLs one replica's worker process (found by its Ray process title, bench/replica_procs.py)
while requests run. In-flight streams must end with an error event and close (never hang: every client
has a read timeout), requests on other replicas go on, Ray Serve starts a new replica, and new requests
succeed again within a deadline. The session app is shared: every test waits for full recovery.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter

import httpx
import pytest

from bench.replica_procs import cpu_seconds, replica_pids
from tests.e2e.stream_client import MODEL, long_chat, stream_outcome

pytestmark = pytest.mark.e2e

APP = "e2e"
READ_TIMEOUT_S = 90  # far above any gap between two chunks; a hung stream trips it
RECOVERY_DEADLINE_S = 300  # a new Scheduler replica loads the model on a busy 2-core box
MAX_STREAMS = 16  # 4 waves of 4 long streams at most
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _status(http: httpx.Client) -> dict | None:
    try:
        response = http.get("/v1/status", timeout=15)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _serves(http: httpx.Client) -> bool:
    try:
        chat = http.post("/v1/chat/completions", json=CHAT, timeout=60)
        embed = http.post("/v1/embeddings", json={"model": "default", "input": "Hi"}, timeout=60)
    except httpx.HTTPError:
        return False
    return chat.status_code == 200 and embed.status_code == 200


def wait_recovered(
    http: httpx.Client, deployment: str, dead_pid: int, num_replicas: int, killed_s: float
) -> float:
    """Until `deployment` has `num_replicas` live processes (none of them `dead_pid`), both Schedulers
    answer /v1/status, and chat and embeddings succeed. Returns the seconds since `killed_s`."""
    deadline = time.monotonic() + RECOVERY_DEADLINE_S
    while time.monotonic() < deadline:
        pids = replica_pids(APP, deployment)
        status = _status(http)
        healthy = status is not None and status["num_replicas"] == 2 and not status["errors"]
        if len(pids) == num_replicas and dead_pid not in pids and healthy and _serves(http):
            return time.monotonic() - killed_s
        time.sleep(1)
    raise TimeoutError(f"{deployment} did not recover within {RECOVERY_DEADLINE_S} s")


def _running_per_replica(http: httpx.Client) -> list[int]:
    status = _status(http)
    return [r["num_running"] for r in status["replicas"]] if status else []


async def _busiest(pids: list[int]) -> int:
    """The replica process that used the most CPU over the next second: one that is decoding."""
    before = {pid: cpu_seconds(pid) or 0.0 for pid in pids}
    await asyncio.sleep(1)
    return max(pids, key=lambda pid: (cpu_seconds(pid) or 0.0) - before[pid])


async def _streams_with_kill(
    base_url: str, http: httpx.Client, pids: list[int]
) -> tuple[list[str], float, int, bool]:
    """Opens long streams, 4 at a time, until both Scheduler replicas decode some (or 16 are open
    and some decode: Ray Serve's router may keep a burst on one replica), then kills a replica that
    is decoding. Returns the streams' ends, the kill time, the victim and whether both were busy."""
    timeout = httpx.Timeout(connect=10, read=READ_TIMEOUT_S, write=10, pool=10)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False) as client:
        tasks: list[asyncio.Future] = []
        running: list[int] = []
        deadline = time.monotonic() + 120
        next_wave_s = time.monotonic()
        while not (
            len(running) == 2 and (min(running) > 0 or (len(tasks) >= MAX_STREAMS and max(running) > 0))
        ):
            if time.monotonic() > deadline:
                for task in tasks:
                    task.cancel()
                pytest.fail(f"no Scheduler replica ran streams: {running} for {len(tasks)}")
            if time.monotonic() >= next_wave_s and len(tasks) < MAX_STREAMS:
                for _ in range(4):
                    body = long_chat(f"Fault test {len(tasks)}: count slowly from one to a thousand.", 300)
                    tasks.append(asyncio.ensure_future(stream_outcome(client, body)))
                next_wave_s = time.monotonic() + 5
            await asyncio.sleep(0.5)
            running = await asyncio.to_thread(_running_per_replica, http)
        both_busy = min(running) > 0
        victim = await _busiest(pids)
        _kill(victim)
        killed_s = time.monotonic()
        return await asyncio.gather(*tasks), killed_s, victim, both_busy


def test_a_killed_scheduler_replica_fails_its_streams_cleanly_and_is_replaced(base_url, http):
    pids = replica_pids(APP, "Scheduler")
    assert len(pids) == 2, pids
    ends, killed_s, victim, both_busy = asyncio.run(_streams_with_kill(base_url, http, pids))
    outcomes = Counter(ends)
    # The dead replica's streams end with an error event; the other replica's run to the end.
    assert "error_event:replica_unavailable" in outcomes, outcomes
    assert set(outcomes) <= {"error_event:replica_unavailable", "completed"}, outcomes
    if both_busy:
        assert "completed" in outcomes, outcomes
    recovered_s = wait_recovered(http, "Scheduler", victim, 2, killed_s)
    print(
        f"Scheduler kill (both busy: {both_busy}): streams {dict(outcomes)}; "
        f"new replica serving {recovered_s:.1f} s after the kill"
    )


async def _requests_during_kill(base_url: str, path: str, body: dict, victim: int) -> tuple[Counter, float]:
    """4 clients send requests back to back; the victim dies once 4 have succeeded, mid-traffic."""
    outcomes: Counter = Counter()
    timeout = httpx.Timeout(connect=10, read=READ_TIMEOUT_S, write=10, pool=10)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False) as client:

        async def one() -> None:
            try:
                response = await client.post(path, json=body)
            except httpx.TimeoutException:
                outcomes["hung"] += 1
                return
            if response.status_code == 200:
                outcomes["ok"] += 1
            else:
                error = response.json()["error"]  # a clean error in OpenAI's shape
                outcomes[f"{response.status_code}:{error.get('code')}"] += 1

        async def client_loop() -> None:
            for _ in range(8):
                await one()

        clients = [asyncio.ensure_future(client_loop()) for _ in range(4)]
        while outcomes["ok"] < 4 and not all(c.done() for c in clients):
            await asyncio.sleep(0.01)
        _kill(victim)
        killed_s = time.monotonic()
        await asyncio.gather(*clients)
    return outcomes, killed_s


@pytest.mark.parametrize(
    ("deployment", "path", "body"),
    [
        ("Tokenizer", "/v1/chat/completions", CHAT),
        ("Embedder", "/v1/embeddings", {"model": "default", "input": ["Hi", "there"]}),
    ],
)
def test_a_killed_tokenizer_or_embedder_gives_clean_errors_and_is_replaced(
    base_url, http, deployment, path, body
):
    (pid,) = replica_pids(APP, deployment)
    outcomes, killed_s = asyncio.run(_requests_during_kill(base_url, path, body, pid))
    assert outcomes["hung"] == 0, outcomes
    # A call in flight on the dead replica is a retryable 503; the others wait for the new replica.
    assert set(outcomes) <= {"ok", "503:replica_unavailable"}, outcomes
    assert outcomes["ok"] >= 4, outcomes  # the round before the kill
    recovered_s = wait_recovered(http, deployment, pid, 1, killed_s)
    print(
        f"{deployment} kill: requests {dict(outcomes)}; new replica serving {recovered_s:.1f} s after the kill"
    )
