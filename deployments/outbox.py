"""A Scheduler replica's end of one output channel: the outputs of one Ingress's requests, gathered.

Owns what is buffered for the channel and when it goes out; the step loop (deployments/step_loop.py)
owns which request's outputs come here. Every Ray item costs the sending and the receiving process
about a millisecond of CPU, taken from the step on a small machine: one item per stream interval for
all of an Ingress's streams, instead of one per stream, is what the channel is for. Needs no Ray.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable

from engine.messages import RequestOutput


class Outbox:
    def __init__(self, interval_s: Callable[[], float]):
        self._interval_s = interval_s
        self._pending: list[RequestOutput] = []
        self._ready = asyncio.Event()  # set: something is pending
        self._urgent = asyncio.Event()  # set: something pending must not wait for the interval

    def put(self, out: RequestOutput, urgent: bool) -> None:
        """Queues one output. An urgent one (a request's first, so its time to first token is not
        stretched) and a finished one (a stream's end) send everything pending at once."""
        self._pending.append(out)
        self._ready.set()
        if urgent or out.finished:
            self._urgent.set()

    async def batches(
        self, idle_s: float, close_if_idle: Callable[[], bool]
    ) -> AsyncGenerator[list[RequestOutput], None]:
        """Everything pending, at most once per interval unless something urgent came; never empty.
        Ends when nothing came for `idle_s` and `close_if_idle()` says so."""
        last_s = 0.0
        while True:
            while not self._ready.is_set():
                await _wait_within(self._ready, idle_s)
                if not self._ready.is_set() and close_if_idle():
                    return
            deadline_s = last_s + self._interval_s()
            while not self._urgent.is_set() and (remaining_s := deadline_s - time.monotonic()) > 0:
                await _wait_within(self._urgent, remaining_s)
            batch, self._pending = self._pending, []
            self._ready.clear()
            self._urgent.clear()
            last_s = time.monotonic()
            yield batch


async def _wait_within(event: asyncio.Event, timeout_s: float) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        pass
