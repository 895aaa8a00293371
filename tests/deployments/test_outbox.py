"""An output channel's outbox (pure logic): what it gathers and when it sends."""

from __future__ import annotations

import asyncio
import time

from engine.messages import RequestOutput

from deployments.outbox import Outbox


def _out(request_id: str, token: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id, [token], f"<{token}>", finish_reason="stop" if finished else None)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_outputs_of_many_requests_within_an_interval_go_out_as_one_batch():
    async def main() -> list[list[RequestOutput]]:
        outbox = Outbox(lambda: 0.2)
        batches = outbox.batches(60.0, lambda: False)
        outbox.put(_out("a", 1), urgent=True)
        first = await anext(batches)  # urgent: at once
        for token in (2, 3):
            outbox.put(_out("a", token), urgent=False)
            outbox.put(_out("b", token), urgent=False)
            await asyncio.sleep(0.02)
        second = await anext(batches)
        return [first, second]

    first, second = run(main())
    assert [o.new_token_ids for o in first] == [[1]]
    assert [(o.request_id, o.new_token_ids[0]) for o in second] == [("a", 2), ("b", 2), ("a", 3), ("b", 3)]


def test_the_interval_holds_plain_outputs_back_but_never_a_first_or_finished_one():
    async def main() -> list[float]:
        outbox = Outbox(lambda: 0.5)
        batches = outbox.batches(60.0, lambda: False)
        outbox.put(_out("a", 1), urgent=False)  # nothing sent yet: the interval has long passed
        await anext(batches)
        waits = []
        for out, urgent in [
            (_out("a", 2), False),
            (_out("b", 1), True),
            (_out("a", 3, finished=True), False),
        ]:
            start_s = time.monotonic()
            outbox.put(out, urgent)
            await anext(batches)
            waits.append(time.monotonic() - start_s)
        return waits

    plain, first, finished = run(main())
    assert plain >= 0.4  # waited for the interval
    assert first < 0.1 and finished < 0.1


def test_the_interval_is_read_at_each_batch():
    async def main() -> float:
        interval = [0.0]
        outbox = Outbox(lambda: interval[0])
        batches = outbox.batches(60.0, lambda: False)
        outbox.put(_out("a", 1), urgent=False)
        await anext(batches)
        interval[0] = 0.3  # the step loop stretched it (more open streams)
        start_s = time.monotonic()
        outbox.put(_out("a", 2), urgent=False)
        await anext(batches)
        return time.monotonic() - start_s

    assert run(main()) >= 0.25


def test_an_idle_outbox_ends_only_when_its_owner_agrees():
    async def main() -> tuple[int, float]:
        asked = []
        outbox = Outbox(lambda: 0.0)

        def close_if_idle() -> bool:
            asked.append(time.monotonic())
            return len(asked) >= 3  # the first two times a request was still bound

        start_s = time.monotonic()
        batches = [batch async for batch in outbox.batches(0.05, close_if_idle)]
        return len(batches), time.monotonic() - start_s

    num_batches, elapsed_s = run(main())
    assert num_batches == 0 and 0.1 <= elapsed_s < 1.0
