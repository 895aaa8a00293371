"""The asyncio side of one engine: a thread that steps it and per-request output queues.

Owns the single stepping thread, its wake-up event and the queues; every scheduling decision is the
engine's. Needs no Ray, so it is tested with a fake engine; deployments/scheduler.py wraps it.

The thread steps back to back while there is work and hands each step's outputs to the event loop,
which routes them while the next step runs: to the request's own stream, or to the output channel of
the Ingress that sent it (deployments/outbox.py), one Ray item per interval for all its streams. (A
loop that awaited each step in an executor left the cores idle 0.4-0.9 ms between steps, the time
for the step's end to reach the event loop and the next step to reach the executor: 3-5% of a single
stream's token; docs/benchmarks.md, tenth pass.)
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from contextlib import aclosing
from queue import SimpleQueue
from typing import Any, Protocol

from engine.errors import EngineError
from engine.messages import EngineStats, GenerateRequest, RequestOutput

from deployments.messages import Admitted
from deployments.outbox import Outbox

logger = logging.getLogger(__name__)

STEP_FAILURE_BACKOFF_S = 0.5  # a step that raises is retried after this, not in a hot loop
MAX_STRETCHED_INTERVAL_S = 1.0  # the cap stretches no interval past this: a longer gap reads as a stall
# A request that waits (queued, or preempted for blocks) gets an empty batch this often: the Ingress
# learns that this replica still holds it and keeps the client's stream alive (api/sse.py).
# deployments/app.py's stream_keepalive_s sets it.
HEARTBEAT_S = 10.0
# An output channel with no request bound to it ends after this long without outputs; the Ingress
# opens another at the next request (its first output then comes on its own stream).
CHANNEL_IDLE_S = 2.0


class SteppableEngine(Protocol):
    def add_request(self, request: GenerateRequest) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> EngineStats: ...


class StepLoop:
    def __init__(
        self,
        engine: SteppableEngine | Any,
        stream_interval_s: float,
        max_stream_batches_per_s: float | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        name: str = "",
    ):
        self._engine = engine
        self.name = name  # the replica's id: output channels and admissions name it
        self._stream_interval_s = stream_interval_s
        self._max_stream_batches_per_s = max_stream_batches_per_s
        self._heartbeat_s = heartbeat_s
        # engine.step blocks in mx.eval: it runs off the event loop, in one thread, never twice at once;
        # so do calls that must not race a step (stats, shutdown), between two steps.
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._work = threading.Event()  # set: a request, an abort or a call may be waiting
        self._calls: SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = SimpleQueue()
        self._event_loop: asyncio.AbstractEventLoop | None = None  # where outputs are routed
        self._stopping = False
        self._queues: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._num_samples: dict[str, int] = {}  # request id -> its n
        self._outboxes: dict[str, Outbox] = {}  # open output channels by channel id
        self._bound: dict[str, Outbox] = {}  # request id -> the outbox its outputs go to
        self._fresh: set[str] = set()  # bound requests with no output yet: their first one is urgent

    @classmethod
    def building(cls, build: Callable[[], Any], *args: Any, **kwargs: Any) -> StepLoop:
        """A loop whose engine `build()` makes on the step thread itself, which then steps it; raises
        what `build` raised. MLX (0.31.2 on) keeps streams per thread: an array left lazy on one
        thread fails to evaluate on another ("There is no Stream(gpu, 0) in current thread"), and an
        engine built on Ray's replica thread failed every step on the GPU; built here, it never
        crosses threads."""
        loop = cls(None, *args, **kwargs)

        def build_here() -> None:
            loop._engine = build()

        try:
            loop._call(build_here).result()
        except BaseException:
            loop.stop()  # no idle thread left behind by a replica that failed to start
            raise
        return loop

    @property
    def engine(self) -> Any:
        return self._engine

    async def generate(
        self, request: GenerateRequest, channel_id: str | None = None
    ) -> AsyncGenerator[list[RequestOutput] | Admitted | EngineError, None]:
        """Yields the request's outputs in batches until each of its `n` samples has a finished one.

        If add_request rejects the request, the one item is the `EngineError` (a value, not a raise:
        the caller maps it to a 4xx/5xx, and the replica logs no traceback for a bad request).
        Otherwise the first item says the request is admitted, at once: an empty batch, or, when the
        caller named an output channel, `Admitted`; if that channel is open here, the outputs go to it
        and this stream carries only heartbeats. Another empty batch follows every `heartbeat_s` in
        which the request got no output (it waits for a slot). Closing or cancelling the generator
        before the final output aborts the request in the engine.
        """
        request_id = request.request_id
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[request_id] = queue
        self._num_samples[request_id] = request.n
        outbox = self._outboxes.get(channel_id) if channel_id is not None else None
        try:
            self._engine.add_request(request)
        except EngineError as exc:
            del self._queues[request_id], self._num_samples[request_id]
            yield exc
            return
        if outbox is not None:
            self._bound[request_id] = outbox
            self._fresh.add(request_id)
        self._event_loop = asyncio.get_running_loop()
        self._ensure_running()
        self._work.set()
        open_indices = set(range(request.n))  # samples with no finished output yet
        try:
            yield [] if channel_id is None else Admitted(self.name, outbox is not None)
            if outbox is None:
                last_yield_s = 0.0
                while open_indices:
                    batch = await self._next_batch(queue, last_yield_s)
                    if batch:  # a heartbeat does not push back the next batch's interval
                        open_indices -= {out.index for out in batch if out.finished}
                        last_yield_s = time.monotonic()
                    yield batch
            while open_indices:  # on the channel: the outputs went there; heartbeats come here
                first = await _get_within(queue, self._heartbeat_s)
                if first is None:
                    yield []
                else:
                    open_indices -= {out.index for out in [first, *_drain(queue)] if out.finished}
        finally:
            self._queues.pop(request_id, None)
            self._num_samples.pop(request_id, None)
            self._bound.pop(request_id, None)
            self._fresh.discard(request_id)
            if open_indices:  # the caller went away (client disconnect) or cancelled the stream
                self._engine.abort_request(request_id)
                self._work.set()

    async def channel(
        self, channel_id: str, idle_s: float = CHANNEL_IDLE_S
    ) -> AsyncGenerator[str | list[RequestOutput], None]:
        """An output channel: first this replica's name, then the outputs of every request that names
        `channel_id`, gathered (deployments/outbox.py), until the caller closes it or it has carried
        nothing for `idle_s` and no request is bound to it. (An open channel is an ongoing request to
        Ray Serve: left open, an idle replica would never scale to zero, and would hold its shutdown
        for graceful_shutdown_timeout_s.)"""
        outbox = Outbox(self.stream_interval_s)
        self._outboxes[channel_id] = outbox

        def close_if_idle() -> bool:  # no await between the check and the removal: none binds meanwhile
            if outbox in self._bound.values():
                return False
            self._forget_outbox(channel_id, outbox)
            return True

        try:
            yield self.name
            async with aclosing(outbox.batches(idle_s, close_if_idle)) as batches:
                async for batch in batches:
                    yield batch
        finally:
            self._forget_outbox(channel_id, outbox)

    def _forget_outbox(self, channel_id: str, outbox: Outbox) -> None:
        if self._outboxes.get(channel_id) is outbox:
            del self._outboxes[channel_id]

    async def _next_batch(
        self, queue: asyncio.Queue[RequestOutput], last_yield_s: float
    ) -> list[RequestOutput]:
        """Everything queued for one request. Batches go out at most once per stream interval: when
        steps are faster than that, several steps coalesce; when slower, each step is one batch.
        A finished output goes out at once: the interval never delays a stream's end. Empty (a
        heartbeat) when nothing came for `heartbeat_s`."""
        first = await _get_within(queue, self._heartbeat_s)
        if first is None:
            return []
        batch = [first]
        deadline_s = last_yield_s + self.stream_interval_s()
        while not batch[-1].finished:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0 or (out := await _get_within(queue, remaining_s)) is None:
                break
            batch.append(out)
        return batch

    def stream_interval_s(self) -> float:
        """The configured interval, stretched so that all open streams together send at most
        max_stream_batches_per_s batches, but never past MAX_STRETCHED_INTERVAL_S: each batch costs
        the replica and the Ingress about a millisecond of CPU, taken from the step. An output
        channel counts as one stream, however many requests it carries."""
        if self._max_stream_batches_per_s is None:
            return self._stream_interval_s
        num_senders = len(self._queues) - len(self._bound) + len(self._outboxes)
        shared_s = min(num_senders / self._max_stream_batches_per_s, MAX_STRETCHED_INTERVAL_S)
        return max(self._stream_interval_s, shared_s)

    async def stats(self) -> EngineStats:
        # Through the step thread: a snapshot is never taken halfway through a step.
        return await asyncio.wrap_future(self._call(self._engine.stats))

    def run_between_steps(self, fn: Callable[[], None], timeout_s: float | None = None) -> None:
        """Runs `fn` on the stepping thread, between two steps, and waits for it: for shutdown work
        that must not race a step (the engine's MLX arrays are the step thread's)."""
        self._call(fn).result(timeout_s)

    @property
    def num_output_channels(self) -> int:
        return len(self._outboxes)

    @property
    def stopped(self) -> bool:
        """True once `stop` was called: calls into the engine raise from then on."""
        return self._stopping

    def stop(self, timeout_s: float | None = None) -> None:
        """Ends the step thread after its current step and waits for it (shutdown; a failed build)."""
        self._stopping = True
        self._work.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _call(self, fn: Callable[[], Any]) -> Future[Any]:
        if self._stopping:
            raise RuntimeError("the step loop is stopped")
        future: Future[Any] = Future()
        self._calls.put((fn, future))
        self._ensure_running()
        self._work.set()
        return future

    def _ensure_running(self) -> None:
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            self._step_until_stopped()
        finally:
            _release_mlx_thread_state()

    def _step_until_stopped(self) -> None:
        """Steps while there is work; sleeps on `_work` when idle (no spinning)."""
        while not self._stopping:
            self._run_calls()
            self._work.clear()  # before the check: a request added after it sets it again
            try:
                if self._engine is None or not self._engine.has_unfinished_requests():
                    if self._calls.empty() and not self._stopping:
                        self._work.wait()
                    continue
                outputs = self._engine.step()
            except Exception:
                # A failure the engine could not pin on some requests (it fails those itself, with its
                # own log line): every request in flight fails, and the log names them.
                ids = ", ".join(sorted(self._queues)) or "none"  # one C call: no race with the loop
                logger.exception("engine step failed; failing the requests in flight: %s", ids)
                self._post(self._fail_all, "engine step failed; see the Scheduler replica's log")
                time.sleep(STEP_FAILURE_BACKOFF_S)
                continue
            if outputs:
                self._post(self._route, outputs)

    def _run_calls(self) -> None:
        while not self._calls.empty():
            fn, future = self._calls.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as exc:  # noqa: BLE001  (the caller's to raise, not this thread's)
                    future.set_exception(exc)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Runs fn(*args) on the event loop, after everything posted before it."""
        assert self._event_loop is not None, "a request set the loop before any step"
        try:
            self._event_loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is left to read these outputs
            pass

    def _route(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._deliver(out)

    def _deliver(self, out: RequestOutput) -> None:
        request_id = out.request_id
        queue = self._queues.get(request_id)
        if queue is None:  # the caller left; its abort output has no reader
            return
        queue.put_nowait(out)
        outbox = self._bound.get(request_id)
        if outbox is not None:
            outbox.put(out, urgent=request_id in self._fresh)
            self._fresh.discard(request_id)

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._queues):
            for index in range(self._num_samples.get(request_id, 1)):
                self._deliver(
                    RequestOutput(request_id, [], "", finish_reason="error", error=message, index=index)
                )
            self._engine.abort_request(request_id)


def _release_mlx_thread_state() -> None:
    """Frees the ending thread's MLX streams and random key (model init and sampling make one) while
    Python still runs. Left to the thread's exit, MLX frees the key in a C++ thread-local destructor
    that takes the GIL after `stop`'s join has returned; if the interpreter is finalizing by then,
    Python ends the thread inside that destructor (pthread_exit) and the process aborts: "terminate
    called without an active exception", on the GPU and the CPU alike."""
    mx = sys.modules.get("mlx.core")  # None: MLX never loaded, so this thread holds none of its state
    if mx is not None:
        mx.clear_streams()


def _drain(queue: asyncio.Queue[RequestOutput]) -> list[RequestOutput]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def _get_within(queue: asyncio.Queue[RequestOutput], timeout_s: float) -> RequestOutput | None:
    """The next output, or None after `timeout_s`. Not `asyncio.wait_for`: on Python 3.11 it can
    swallow the caller's cancellation when the get completes at the same moment, and a lost
    cancellation would leave a request running for a client that left."""
    try:
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    except TimeoutError:
        return None
