"""api/sse.py: each frame's JSON stays on one line for every SSE line reader, UTF-8 kept; keep-alive
comments while the engine holds a waiting request, none once it went silent."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from api.sse import KEEPALIVE, event, named_event, with_keepalive

# Characters JSON may leave raw in a string that str.splitlines (and httpx's aiter_lines) break at.
TEXT = "one\u2028two\x85three\u2029four, né 中"


def _lines(wire: str) -> list[str]:
    decoder = httpx._decoders.LineDecoder()
    return [line for line in decoder.decode(wire) + decoder.flush() if line]


def test_an_event_is_one_data_line_for_a_splitlines_reader_and_decodes_to_the_same_text():
    lines = _lines(event({"content": TEXT}))
    assert len(lines) == 1 and lines[0].startswith("data: ")
    assert json.loads(lines[0][len("data: ") :]) == {"content": TEXT}
    assert "né 中" in lines[0]  # UTF-8 is sent as it is, not as \\u escapes


def test_a_named_event_keeps_its_two_lines():
    lines = _lines(named_event("content_block_delta", {"text": TEXT}))
    assert lines[0] == "event: content_block_delta"
    assert len(lines) == 2 and json.loads(lines[1][len("data: ") :]) == {"text": TEXT}


async def _slow_frames(gaps_s: list[float], closed: list[bool]):
    try:
        for i, gap_s in enumerate(gaps_s):
            await asyncio.sleep(gap_s)
            yield f"data: {i}\n\n"
    finally:
        closed.append(True)


def _beats(interval_s: float | None):
    """A heartbeat source: one every `interval_s`, or never (an engine that went silent)."""

    async def heartbeat() -> None:
        await asyncio.sleep(3600 if interval_s is None else interval_s)

    return heartbeat


def _wire(gaps_s: list[float], beat_s: float | None) -> tuple[list[str], list[bool]]:
    closed: list[bool] = []

    async def run():
        return [f async for f in with_keepalive(_slow_frames(gaps_s, closed), _beats(beat_s))]

    return asyncio.run(asyncio.wait_for(run(), 10)), closed


def test_a_waiting_stream_gets_a_keepalive_comment_per_heartbeat_and_every_frame_in_order():
    frames, closed = _wire([0.0, 0.32, 0.0], beat_s=0.05)
    data = [f for f in frames if f != KEEPALIVE]
    assert data == ["data: 0\n\n", "data: 1\n\n", "data: 2\n\n"] and closed == [True]
    assert frames.index(KEEPALIVE) == 1 and 3 <= frames.count(KEEPALIVE) <= 7  # ~6 beats in the 0.32 s gap
    assert _lines("".join(frames))[1] == ": keep-alive"  # a comment line: SSE clients skip it


def test_no_keepalive_without_heartbeats():
    frames, _ = _wire([0.0, 0.3], beat_s=None)
    assert frames == ["data: 0\n\n", "data: 1\n\n"]


def test_closing_mid_wait_cancels_the_pending_frame_and_closes_the_source():
    closed: list[bool] = []

    async def run():
        stream = with_keepalive(_slow_frames([0.0, 30.0], closed), _beats(0.05))
        first, second = await anext(stream), await anext(stream)
        await stream.aclose()  # the client left while the source waits 30 s
        return first, second

    start_s = time.monotonic()
    assert asyncio.run(asyncio.wait_for(run(), 10)) == ("data: 0\n\n", KEEPALIVE)
    assert closed == [True] and time.monotonic() - start_s < 5
