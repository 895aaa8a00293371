"""SSE stream shape: a chunk per batch, the usage chunk, [DONE]; failures mid-stream become error events."""

from __future__ import annotations

import asyncio
import json

from engine.messages import RequestOutput

import pytest
from starlette.requests import ClientDisconnect

from api.errors import ApiError
from api.openai_outputs import ChoiceState, ResponseMeta, chat_chunk, chat_completion, chat_usage_chunk
from api.openai_stream import sse_frames
from api.output_parser import OutputParser, OutputParsing
from api.sse import EventStreamResponse
from api.tool_parsers import make_format
from tests.api.tool_goldens import TOOLS

META = ResponseMeta("chatcmpl-1", 1, "smol")


async def no_texts(ids: set[int]) -> dict[int, str]:
    return {}


def frames(batches, with_usage: bool = False, parsing: OutputParsing | None = None) -> list[str]:
    states = [ChoiceState(0, num_prompt_tokens=2)]
    parser = OutputParser(parsing) if parsing is not None else None

    def chunk(index, delta, first, text):
        return chat_chunk(META, index, delta, first, with_usage, text, parser)

    usage = (lambda: chat_usage_chunk(META, states)) if with_usage else None

    async def run():
        return [frame async for frame in sse_frames(batches, states, chunk, usage, no_texts)]

    return asyncio.run(run())


def payloads(sse_frames_: list[str]) -> list:
    assert all(f.startswith("data: ") and f.endswith("\n\n") for f in sse_frames_)
    return [f[len("data: ") : -2] for f in sse_frames_]


async def two_batches():
    yield 0, [RequestOutput("r", [1], "Hi")]
    yield 0, [RequestOutput("r", [2], "!", finish_reason="stop", num_output_tokens=2)]


def test_a_chunk_per_batch_then_done():
    data = payloads(frames(two_batches()))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["Hi", "!"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_usage_chunk_comes_last_before_done():
    data = payloads(frames(two_batches(), with_usage=True))
    usage = json.loads(data[-2])
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 4 and data[-1] == "[DONE]"


def test_failure_mid_stream_is_an_error_event_then_done():
    closed = []

    async def failing():
        try:
            yield 0, [RequestOutput("r", [1], "Hi")]
            raise ApiError(500, "the scheduler failed", "server_error", code="scheduler_failed")
        finally:
            closed.append(True)

    data = payloads(frames(failing()))
    assert json.loads(data[0])["choices"][0]["delta"]["content"] == "Hi"
    assert json.loads(data[1])["error"]["code"] == "scheduler_failed"
    assert data[2] == "[DONE]" and closed == [True]


def test_failed_request_output_is_an_error_event():
    async def failed():
        yield 0, [RequestOutput("r", [], "", finish_reason="error", error="sampler blew up")]

    data = payloads(frames(failed()))
    error = json.loads(data[0])["error"]
    assert error["code"] == "request_failed" and "sampler blew up" in error["message"] and data[1] == "[DONE]"


def test_unexpected_exception_is_a_server_error_event():
    async def broken():
        yield 0, [RequestOutput("r", [1], "Hi")]
        raise RuntimeError("kaput")

    data = payloads(frames(broken()))
    assert json.loads(data[1])["error"]["type"] == "server_error" and data[2] == "[DONE]"


async def _never() -> None:
    await asyncio.Event().wait()


def test_event_stream_response_closes_even_if_the_client_left_before_the_first_frame():
    started, closed = [], []

    async def never_started():
        started.append(True)
        yield "data: x\n\n"

    async def gone(message):  # the client hung up: the first send fails
        raise OSError("connection reset")

    async def receive():
        return {"type": "http.disconnect"}

    async def run():
        response = EventStreamResponse(
            never_started(), on_close=lambda: closed.append(True), heartbeat=_never
        )
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/"}
        with pytest.raises((OSError, ClientDisconnect)):  # Starlette reports a failed send as a disconnect
            await response(scope, receive, gone)

    asyncio.run(run())
    assert closed == [True] and started == []
    assert (
        EventStreamResponse(two_batches(), on_close=lambda: None, heartbeat=_never).media_type
        == "text/event-stream"
    )


HERMES = OutputParsing(make_format("hermes", TOOLS), frozenset(tool["name"] for tool in TOOLS))
CUT_CALL = ["<tool_call>", '\n{"name": "get_time", ', '"arguments": {"timezone": "Eur']


async def cut_batches(pieces: list[str]):
    """One batch per piece; the last one hits max_tokens."""
    for n, piece in enumerate(pieces, start=1):
        finish = "length" if n == len(pieces) else None
        yield 0, [RequestOutput("r", [n], piece, finish_reason=finish, num_output_tokens=n)]


def _streamed(pieces: list[str]) -> tuple[str, list[dict], str]:
    """(content, tool-call deltas, last finish reason) of a parsed stream."""
    chunks = [json.loads(d) for d in payloads(frames(cut_batches(pieces), parsing=HERMES))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    return content, calls, chunks[-1]["choices"][0]["finish_reason"]


def _whole(pieces: list[str]) -> dict:
    state = ChoiceState(0, num_prompt_tokens=2)
    state.add([RequestOutput("r", [1], "".join(pieces), finish_reason="length", num_output_tokens=3)])
    return chat_completion(META, [state], {}, HERMES).choices[0].model_dump()


def test_a_call_cut_by_max_tokens_is_a_call_with_its_arguments_so_far_and_finish_length():
    content, calls, finish = _streamed(["On it.\n", *CUT_CALL])
    assert (content, finish) == ("On it.\n", "length")
    assert calls[0]["function"]["name"] == "get_time"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"timezone": "Eur'
    whole = _whole(["On it.\n", *CUT_CALL])
    assert (whole["message"]["content"], whole["finish_reason"]) == ("On it.\n", "length")
    [call] = whole["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"timezone": "Eur'}


def test_a_call_cut_before_its_name_leaves_no_markup_and_no_call():
    pieces = ["<tool_call>", '\n{"name": "get_t']
    assert _streamed(pieces) == ("", [], "length")
    whole = _whole(pieces)
    assert whole["message"]["content"] == "" and whole["message"]["tool_calls"] is None
    assert whole["finish_reason"] == "length"
