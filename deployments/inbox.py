"""This Ingress's end of the output channels to one Scheduler deployment: one channel per replica.

Owns the channels' reader tasks and the queue of each request waiting for outputs; Generation
(deployments/generation.py) owns the requests. A request names the channel in its `generate` call;
the replica that takes it answers `Admitted`, and sends its outputs on the channel if this Ingress
has one open there, else on the call's own stream, and this opens a channel for the next requests.
A channel that fails or ends fails the requests bound to it (a replica ends one only when none is);
the next admission there opens another, at once after an end, after `retry_s` after a failure. See
deployments/outbox.py for why.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from typing import Any

from engine.messages import RequestOutput

from ray.exceptions import RayActorError

from api.errors import ApiError, internal_error
from deployments.messages import Admitted, ChannelRequest
from deployments.replica_errors import replica_died

logger = logging.getLogger("ray.serve")  # the Ingress replica's log file and the dashboard

OPEN_TIMEOUT_S = 10.0  # a channel not open by then (its replica full or gone) is given up
RETRY_S = 5.0  # after a channel failed, the next try at its replica waits this long

Item = list[RequestOutput] | ApiError


class Inbox:
    def __init__(self, scheduler: Any, open_timeout_s: float = OPEN_TIMEOUT_S, retry_s: float = RETRY_S):
        self._scheduler = scheduler  # a WatchedHandle; Any keeps fakes in tests simple
        self._open_timeout_s = open_timeout_s
        self._retry_s = retry_s
        self.channel_id = uuid.uuid4().hex  # per Ingress process and model: a replica keys its outbox by it
        self._queues: dict[str, asyncio.Queue[Item]] = {}  # request id -> its outputs
        self._readers: dict[str, asyncio.Task[None] | None] = {}  # replica id -> its open channel's reader
        self._bound: dict[str, set[str]] = {}  # replica id -> requests whose outputs come on its channel
        self._failed_s: dict[str, float] = {}  # replica id -> when its channel last failed

    def register(self, request_id: str) -> asyncio.Queue[Item]:
        """Called before the `generate` call: outputs may come on the channel before its admission."""
        queue: asyncio.Queue[Item] = asyncio.Queue()
        self._queues[request_id] = queue
        return queue

    def forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        for bound in self._bound.values():
            bound.discard(request_id)

    def admitted(self, request_id: str, admitted: Admitted) -> None:
        """Binds an admitted request to its replica's channel, or opens one there for later requests."""
        replica_id = admitted.replica_id
        if not admitted.on_channel:
            self._ensure_open(replica_id)
        elif replica_id in self._readers:  # open, or opening: the replica has it before its hello is read
            self._bound.setdefault(replica_id, set()).add(request_id)
        elif (queue := self._queues.get(request_id)) is not None:  # its channel failed meanwhile
            queue.put_nowait(_lost(replica_id, None))

    def _ensure_open(self, replica_id: str) -> None:
        failed_s = self._failed_s.get(replica_id)
        if replica_id in self._readers or (
            failed_s is not None and time.monotonic() - failed_s < self._retry_s
        ):
            return
        self._readers[replica_id] = None  # opening: no second reader meanwhile
        # Started from a callback, outside the request: a task started inside a streamed response
        # was cancelled with it (Starlette's cancel scope ends the response's tasks).
        asyncio.get_running_loop().call_soon(self._start_reader, replica_id, context=contextvars.Context())

    def _start_reader(self, replica_id: str) -> None:
        self._readers[replica_id] = asyncio.get_running_loop().create_task(self._read(replica_id))

    async def _read(self, replica_id: str) -> None:
        streaming = self._scheduler.options(stream=True)
        stream = streaming.output_channel.remote(ChannelRequest(self.channel_id, replica_id))
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(self._open_timeout_s):
                hello = await stream.__anext__()
            if hello != replica_id:
                raise RuntimeError(f"the channel for replica {replica_id} reached {hello}")
            async for batch in stream:
                self._deliver(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  (logged; its requests fail, the next ones use streams)
            failure = exc
            self._failed_s[replica_id] = time.monotonic()
            logger.warning("the output channel to Scheduler replica %s failed: %r", replica_id, exc)
        finally:
            self._readers.pop(replica_id, None)
            stream.cancel()
            for request_id in self._bound.pop(replica_id, set()):
                if (queue := self._queues.get(request_id)) is not None:
                    queue.put_nowait(_lost(replica_id, failure))

    def _deliver(self, batch: list[RequestOutput]) -> None:
        by_request: dict[str, list[RequestOutput]] = {}
        for out in batch:
            by_request.setdefault(out.request_id, []).append(out)
        for request_id, outputs in by_request.items():
            queue = self._queues.get(request_id)
            if queue is not None:  # None: the request is gone (its client left)
                queue.put_nowait(outputs)


def _lost(replica_id: str, failure: BaseException | None) -> ApiError:
    if isinstance(failure, RayActorError):
        return replica_died()
    reason = f": {type(failure).__name__}: {failure}" if failure is not None else ""
    return internal_error(
        f"the output channel to Scheduler replica {replica_id} ended{reason}", "scheduler_failed"
    )
