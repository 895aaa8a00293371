"""Drives the Scheduler streams of one HTTP request, for the Ingress.

Owns the streaming handle calls: starts one per engine request, surfaces a rejection before any byte
goes out, merges several streams, splits a request's `n` samples into choices, passes on the heartbeats
of a request that waits in a Scheduler's queue (its empty batches), and cancels whatever is still
running when the caller goes away (the Scheduler then aborts the request and frees its blocks).
With an Inbox (deployments/inbox.py), a request admitted where this Ingress has an output channel
gets its outputs from the channel, and its stream only says that it waits (heartbeats) or failed.
Converts nothing to JSON.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from engine.errors import EngineError
from engine.messages import GenerateRequest, RequestOutput

from ray.exceptions import RayActorError

from api.errors import ApiError, from_engine_error, internal_error
from deployments.inbox import Inbox
from deployments.messages import Admitted
from deployments.replica_errors import replica_died
from deployments.watched_handle import WatchedHandle, WatchedStream

logger = logging.getLogger(__name__)

Batch = list[RequestOutput]


class Generation:
    """One Scheduler stream per request; `start()` once, then iterate `batches()` once.

    Request k's sample j is choice `sum(n of requests before k) + j`, so P prompts with n samples
    each give choice p * n + j (as OpenAI numbers them)."""

    def __init__(
        self,
        scheduler: WatchedHandle,
        requests: list[GenerateRequest],
        prompt_param: str,
        inbox: Inbox | None = None,
    ):
        self._inbox = inbox
        self._ids = [r.request_id for r in requests]
        # Registered before the calls: a channel may bring outputs before the admission.
        self._queues = [inbox.register(i) for i in self._ids] if inbox is not None else []
        channel = () if inbox is None else (inbox.channel_id,)
        streaming = scheduler.options(stream=True)
        self._streams: list[WatchedStream] = [streaming.generate.remote(r, *channel) for r in requests]
        self._watchers: list[asyncio.Task[None] | None] = [None] * len(requests)  # on the channel
        self._done = [False] * len(requests)  # every sample finished, or the request failed
        self._ended = [False] * len(requests)  # the stream ended or failed: nothing to cancel
        self._open = [set(range(r.n)) for r in requests]  # sample indices with no finished output yet
        self._bases = [sum(r.n for r in requests[:k]) for k in range(len(requests))]
        self._firsts: list[Batch] = []
        self._prompt_param = prompt_param
        self._beat = asyncio.Event()  # set by each heartbeat after start(); api/sse.py waits on it

    async def start(self) -> None:
        """Waits until the Scheduler admitted every request (their first, empty, batches), so that a
        rejected request is still a clean 4xx/5xx response."""
        try:
            items = await asyncio.gather(*(self._next(i) for i in range(len(self._streams))))
        except BaseException:
            self.cancel()
            raise
        for item in items:
            if isinstance(item, EngineError):
                self.cancel()
                raise from_engine_error(item, self._prompt_param)
        self._firsts = list(items)  # type: ignore[arg-type]
        self._beat.clear()  # the admissions are no heartbeats

    async def batches(self) -> AsyncGenerator[tuple[int, Batch], None]:
        """(choice index, batch) until every stream has finished; cancels the rest on exit."""
        try:
            for stream, batch in enumerate(self._firsts):
                for item in self._split(stream, batch):
                    yield item
            if len(self._streams) == 1:
                while (later := await self._next(0)) is not None:
                    assert isinstance(later, list), "only a stream's first item may be a rejection"
                    for item in self._split(0, later):
                        yield item
            else:
                async for stream, batch in self._merged():
                    for item in self._split(stream, batch):
                        yield item
        finally:
            self.cancel()

    def _split(self, stream: int, batch: Batch) -> list[tuple[int, Batch]]:
        """One stream's batch as one sub-batch per choice (its outputs' sample index), in order."""
        by_choice: dict[int, Batch] = {}
        for out in batch:
            by_choice.setdefault(self._bases[stream] + out.index, []).append(out)
        return list(by_choice.items())

    async def _merged(self) -> AsyncGenerator[tuple[int, Batch], None]:
        queue: asyncio.Queue[tuple[int, Batch | BaseException | None]] = asyncio.Queue()
        tasks = [asyncio.ensure_future(self._pump(i, queue)) for i in range(len(self._streams))]
        try:
            num_open = sum(not done for done in self._done)
            while num_open:
                index, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    num_open -= 1
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()

    async def _pump(self, index: int, queue: asyncio.Queue[tuple[int, Batch | BaseException | None]]) -> None:
        if self._done[index]:
            return
        try:
            while (batch := await self._next(index)) is not None:
                queue.put_nowait((index, batch))
        except Exception as exc:  # noqa: BLE001  (re-raised by the consumer in _merged)
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    async def _next(self, index: int) -> Batch | EngineError | None:
        """The stream's next item, or None once it has finished."""
        item: Batch | EngineError | None
        if self._watchers[index] is not None:
            if self._done[index]:
                return None
            item = await self._from_channel(index)
        else:
            try:
                streamed = await self._from_stream(index)
            finally:
                self._done[index] = self._ended[index]
            item = self._admit(index, streamed) if isinstance(streamed, Admitted) else streamed
        if isinstance(item, list):
            if not item:  # admitted, or still waiting for a slot
                self._beat.set()
            self._open[index] -= {out.index for out in item if out.finished}
            self._done[index] = not self._open[index]
        return item

    async def _from_stream(self, index: int) -> Batch | Admitted | EngineError | None:
        try:
            item: Batch | Admitted | EngineError = await self._streams[index].__anext__()
        except StopAsyncIteration:
            self._ended[index] = True
            return None
        except (ApiError, asyncio.CancelledError):
            raise
        except RayActorError as exc:  # the replica's process died: Ray Serve is starting another
            self._ended[index] = True
            logger.warning("the Scheduler replica of stream %d died: %s", index, type(exc).__name__)
            raise replica_died() from exc
        except Exception as exc:
            self._ended[index] = True
            logger.exception("Scheduler stream %d failed", index)
            message = f"the scheduler failed: {type(exc).__name__}: {exc}"
            raise internal_error(message, "scheduler_failed") from exc
        return item

    def _admit(self, index: int, admitted: Admitted) -> Batch:
        assert self._inbox is not None, "only a call that named a channel is answered Admitted"
        self._inbox.admitted(self._ids[index], admitted)
        if admitted.on_channel:
            self._watchers[index] = asyncio.ensure_future(self._watch(index))
        return []

    async def _watch(self, index: int) -> None:
        """Passes a channel-bound stream's heartbeats and failure on to the request's queue."""
        queue = self._queues[index]
        try:
            while (item := await self._from_stream(index)) is not None:
                if not item:
                    queue.put_nowait([])
        except ApiError as exc:
            queue.put_nowait(exc)

    async def _from_channel(self, index: int) -> Batch:
        """Everything the channel has brought for the request: one batch, or a heartbeat ([])."""
        queue = self._queues[index]
        batch: Batch = []
        item = await queue.get()
        while True:
            if isinstance(item, ApiError):
                self._done[index] = True
                raise item
            batch.extend(item)
            if queue.empty():
                return batch
            item = queue.get_nowait()

    async def heartbeat(self) -> None:
        """Returns at the next heartbeat: a Scheduler still holds the request, waiting for a slot."""
        await self._beat.wait()
        self._beat.clear()

    def cancel(self) -> None:
        for index, stream in enumerate(self._streams):
            watcher = self._watchers[index]
            if watcher is None:
                if not self._done[index]:
                    stream.cancel()
            elif self._open[index]:  # on the channel, unfinished (a finished one's watcher reads the end)
                watcher.cancel()
                if not self._ended[index]:
                    stream.cancel()
            self._done[index] = self._ended[index] = True
        if self._inbox is not None:
            for request_id in self._ids:
                self._inbox.forget(request_id)
