"""Generation through an Inbox over fake Scheduler streams and output channels (pure logic; the real
handles run in tests/e2e): where outputs come from, what a lost channel does, what is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.messages import GenerateRequest, RequestOutput, SamplingParams

import pytest
from ray.exceptions import RayActorError

from api.errors import ApiError
from deployments.generation import Generation
from deployments.inbox import Inbox
from deployments.messages import Admitted, ChannelRequest


class QueueStream:
    """A streaming call's response fed by the test: put items (or an exception to raise), end with None."""

    def __init__(self, items: list | None = None):
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        for item in items or []:
            self.queue.put_nowait(item)
        self.cancelled = False

    def put(self, item: Any) -> None:
        self.queue.put_nowait(item)

    def __aiter__(self) -> QueueStream:
        return self

    async def __anext__(self) -> Any:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    """`options(stream=True).generate.remote(request, channel_id)` and `.output_channel.remote(...)`."""

    def __init__(self, streams: list[QueueStream], channels: list[QueueStream]):
        self.calls_generate: list[tuple] = []
        self.calls_channel: list[tuple] = []
        self.generate = _Method(iter(streams), self.calls_generate)
        self.output_channel = _Method(iter(channels), self.calls_channel)

    def options(self, stream: bool) -> FakeScheduler:
        assert stream
        return self


class _Method:
    def __init__(self, responses, calls: list):
        self.responses, self.calls = responses, calls

    def remote(self, *args: Any) -> QueueStream:
        self.calls.append(args)
        return next(self.responses)


def _request(request_id: str) -> GenerateRequest:
    return GenerateRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=2))


def _out(request_id: str, token: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id, [token], f"<{token}>", finish_reason="length" if finished else None)


def _tokens(batches: list) -> list[int]:
    return [out.new_token_ids[0] for _, batch in batches for out in batch]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def _setup(num_streams: int) -> tuple[FakeScheduler, Inbox, list[QueueStream], QueueStream]:
    streams, channel = [QueueStream() for _ in range(num_streams)], QueueStream()
    scheduler = FakeScheduler(streams, [channel])
    return scheduler, Inbox(scheduler, open_timeout_s=1.0, retry_s=0.3), streams, channel


async def _admitted_off_channel(scheduler: FakeScheduler, inbox: Inbox, stream: QueueStream) -> list:
    """Runs request "a", which its replica admits before this Ingress has a channel there."""
    stream.put(Admitted("r1", on_channel=False))
    stream.put([_out("a", 2), _out("a", 1, finished=True)])
    stream.put(None)
    generation = Generation(scheduler, [_request("a")], "messages", inbox)  # type: ignore[arg-type]
    await generation.start()
    batches = [item async for item in generation.batches()]
    assert _tokens(batches) == [2, 1]
    return batches


async def _on_channel() -> tuple[Generation, FakeScheduler, Inbox, list[QueueStream], QueueStream]:
    """Request "a" opens the channel to replica r1 (it streams its own outputs); request "b" is then
    admitted on that channel and started. Feed "b"'s outputs through the returned channel."""
    scheduler, inbox, streams, channel = _setup(2)
    await _admitted_off_channel(scheduler, inbox, streams[0])
    channel.put("r1")  # the channel's hello: it reached the replica it named
    await asyncio.sleep(0.01)
    streams[1].put(Admitted("r1", on_channel=True))  # the stream ends only after the outputs
    generation = Generation(scheduler, [_request("b")], "messages", inbox)  # type: ignore[arg-type]
    await generation.start()
    return generation, scheduler, inbox, streams, channel


def test_the_first_request_streams_its_own_outputs_and_opens_a_channel_for_the_next():
    async def main() -> tuple:
        generation, scheduler, inbox, streams, channel = await _on_channel()
        channel.put([_out("b", 2), _out("other", 7)])
        channel.put([_out("b", 1, finished=True)])
        second = [item async for item in generation.batches()]
        return second, scheduler, inbox, streams

    second, scheduler, inbox, streams = run(main())
    assert _tokens(second) == [2, 1]  # "a"'s, on its own stream, are checked where it runs
    assert scheduler.calls_channel == [(ChannelRequest(inbox.channel_id, "r1"),)]
    assert [call[1] for call in scheduler.calls_generate] == [inbox.channel_id] * 2
    assert not streams[1].cancelled  # finished: its stream ends by itself, nothing to abort


def test_a_request_admitted_on_a_channel_before_its_hello_is_read_gets_its_outputs_there():
    """The replica has the channel as soon as the call reaches it, and binds the next admissions to
    it; this Ingress reads the hello a hop later. Those requests wait for the channel, not fail."""

    async def main() -> tuple:
        scheduler, inbox, streams, channel = _setup(2)
        await _admitted_off_channel(scheduler, inbox, streams[0])  # opens the channel; no hello yet
        streams[1].put(Admitted("r1", on_channel=True))
        generation = Generation(scheduler, [_request("b")], "messages", inbox)  # type: ignore[arg-type]
        await generation.start()
        channel.put("r1")
        channel.put([_out("b", 2), _out("b", 1, finished=True)])
        return [item async for item in generation.batches()], streams[1].cancelled

    batches, aborted = run(main())
    assert _tokens(batches) == [2, 1] and not aborted


def test_a_channel_bound_request_gets_heartbeats_from_its_stream():
    async def main() -> tuple:
        generation, _scheduler, _inbox, streams, channel = await _on_channel()
        beat = asyncio.ensure_future(generation.heartbeat())
        streams[1].put([])  # still waiting for a slot
        await asyncio.sleep(0.05)
        channel.put([_out("b", 1, finished=True)])
        batches = [item async for item in generation.batches()]
        return beat.done(), batches

    beat_came, batches = run(main())
    assert beat_came and _tokens(batches) == [1]


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [(RayActorError(), 503, "replica_unavailable"), (RuntimeError("boom"), 500, "scheduler_failed")],
)
def test_a_lost_channel_fails_and_aborts_its_requests(failure, status, code):
    async def main() -> tuple:
        generation, _scheduler, _inbox, streams, channel = await _on_channel()
        channel.put([_out("b", 2)])
        channel.put(failure)
        with pytest.raises(ApiError) as raised:
            [item async for item in generation.batches()]
        return raised.value, streams[1].cancelled, channel.cancelled

    error, aborted, channel_closed = run(main())
    assert (error.status, error.code) == (status, code)
    assert aborted and channel_closed  # the request is aborted in the engine


def test_a_channel_that_reaches_another_replica_is_given_up_and_retried_later():
    async def main() -> tuple:
        streams = [QueueStream() for _ in range(3)]
        wrong, right = QueueStream(["r2"]), QueueStream(["r1"])
        scheduler = FakeScheduler(streams, [wrong, right])
        inbox = Inbox(scheduler, open_timeout_s=1.0, retry_s=0.2)  # type: ignore[arg-type]
        await _admitted_off_channel(scheduler, inbox, streams[0])
        await asyncio.sleep(0.01)
        first_try_open = "r1" in inbox._readers
        inbox.admitted("x", Admitted("r1", on_channel=False))  # within retry_s: no second try
        tries_soon = len(scheduler.calls_channel)
        await asyncio.sleep(0.25)
        inbox.admitted("y", Admitted("r1", on_channel=False))
        await asyncio.sleep(0.01)
        return (
            first_try_open,
            wrong.cancelled,
            tries_soon,
            len(scheduler.calls_channel),
            "r1" in inbox._readers,
        )

    first_try_open, wrong_closed, tries_soon, tries, open_now = run(main())
    assert not first_try_open and wrong_closed and tries_soon == 1
    assert tries == 2 and open_now


def test_a_channel_that_never_opens_is_given_up():
    async def main() -> tuple:
        streams, silent = [QueueStream()], QueueStream()
        scheduler = FakeScheduler(streams, [silent])
        inbox = Inbox(scheduler, open_timeout_s=0.1, retry_s=10.0)  # type: ignore[arg-type]
        first = await _admitted_off_channel(scheduler, inbox, streams[0])
        await asyncio.sleep(0.2)
        return first, silent.cancelled, inbox._readers

    first, given_up, readers = run(main())
    assert _tokens(first) == [2, 1] and given_up and readers == {}


def test_cancelling_an_unfinished_channel_bound_request_aborts_it_and_forgets_its_queue():
    async def main() -> tuple:
        generation, _scheduler, inbox, streams, channel = await _on_channel()
        channel.put([_out("b", 2)])
        batches = generation.batches()
        await anext(batches)
        await batches.aclose()  # the client went away
        return streams[1].cancelled, inbox._queues

    aborted, queues = run(main())
    assert aborted and queues == {}


def test_a_channel_its_replica_ended_idle_is_opened_again_at_the_next_admission():
    async def main() -> tuple:
        streams, first, second = [QueueStream()], QueueStream(["r1", None]), QueueStream(["r1"])
        scheduler = FakeScheduler(streams, [first, second])
        inbox = Inbox(scheduler, open_timeout_s=1.0, retry_s=60.0)  # type: ignore[arg-type]
        await _admitted_off_channel(scheduler, inbox, streams[0])
        await asyncio.sleep(0.01)  # the first channel said hello and ended: idle, nothing bound
        after_end = ("r1" in inbox._readers, len(scheduler.calls_channel))
        inbox.admitted("x", Admitted("r1", on_channel=False))
        await asyncio.sleep(0.01)
        return after_end, len(scheduler.calls_channel), "r1" in inbox._readers

    after_end, tries, open_now = run(main())
    assert after_end == (False, 1)
    assert tries == 2 and open_now  # no retry wait: an end is no failure
