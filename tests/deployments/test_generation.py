"""Generation over fake Scheduler streams (pure logic; the real handles run in tests/e2e): admission,
heartbeats, rejections and cancellation as the Ingress sees them."""

from __future__ import annotations

import asyncio

from engine.errors import ContextLengthExceededError
from engine.messages import GenerateRequest, RequestOutput, SamplingParams

import pytest

from api.errors import ApiError
from deployments.generation import Generation


class FakeStream:
    """A streaming handle call's response: yields `items`, sleeping `gap_s` before each."""

    def __init__(self, items: list, gap_s: float = 0.0):
        self.items, self.gap_s, self.cancelled = list(items), gap_s, False

    async def __anext__(self):
        await asyncio.sleep(self.gap_s)
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    """Stands in for `scheduler.options(stream=True).generate.remote(request)`."""

    def __init__(self, streams: list[FakeStream]):
        self.streams = iter(streams)
        self.generate = self

    def options(self, stream: bool) -> FakeScheduler:
        assert stream
        return self

    def remote(self, request: GenerateRequest) -> FakeStream:
        return next(self.streams)


def _request(request_id: str) -> GenerateRequest:
    return GenerateRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=2))


def _out(token: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("a", [token], f"<{token}>", finish_reason="length" if finished else None)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_heartbeats_after_admission_wake_heartbeat_and_carry_no_output():
    stream = FakeStream([[], [], [_out(1)], [], [_out(2, finished=True)]], gap_s=0.05)

    async def main():
        generation = Generation(FakeScheduler([stream]), [_request("a")], "messages")
        await generation.start()  # returns on the admission, before any output
        beat = asyncio.ensure_future(generation.heartbeat())
        batches = [batch async for batch in generation.batches()]
        return batches, beat.done()  # asked here: asyncio.run cancels what is left, which is "done" too

    batches, beat_came = run(main())
    assert [[o.new_token_ids for o in batch] for _, batch in batches] == [[[1]], [[2]]]
    assert beat_came  # the empty batch after admission was a heartbeat


def test_the_admission_alone_is_no_heartbeat():
    stream = FakeStream([[], [_out(1, finished=True)]], gap_s=0.05)

    async def main():
        generation = Generation(FakeScheduler([stream]), [_request("a")], "messages")
        await generation.start()
        beat = asyncio.ensure_future(generation.heartbeat())
        batches = [batch async for batch in generation.batches()]
        await asyncio.sleep(0.1)
        return batches, beat.done()

    batches, beat_came = run(main())
    assert len(batches) == 1 and not beat_came


def test_a_rejected_request_raises_its_api_error_and_cancels_the_others():
    accepted = FakeStream([[], [_out(1, finished=True)]])
    rejected = FakeStream([ContextLengthExceededError("prompt too long", param="messages")])

    async def main():
        generation = Generation(
            FakeScheduler([accepted, rejected]), [_request("a"), _request("b")], "messages"
        )
        await generation.start()

    with pytest.raises(ApiError) as raised:
        run(main())
    assert raised.value.status == 400 and accepted.cancelled
