"""Anthropic message objects and stream events: stop fields, usage, event order, errors mid-stream."""

from __future__ import annotations

import asyncio
import json

from engine.messages import RequestOutput

import pytest

from api.anthropic_errors import error_body, error_type
from api.anthropic_outputs import MessageMeta, message
from api.anthropic_stream import message_events
from api.choice_state import ChoiceState
from api.errors import ApiError
from api.output_parser import OutputParsing
from api.tool_parsers import make_format
from tests.api.tool_goldens import TOOLS

META = MessageMeta("msg_1", "smol")


def out(text: str, finish: str | None = None, stop_reason: str | int | None = None) -> RequestOutput:
    return RequestOutput("msg_1", [1], text, finish, stop_reason, num_prompt_tokens=5, num_output_tokens=0)


def finished(*outputs: RequestOutput) -> ChoiceState:
    state = ChoiceState(0, num_prompt_tokens=5)
    state.add(outputs)
    return state


@pytest.mark.parametrize(
    ("finish", "stop_reason", "expected"),
    [
        ("stop", 2, ("end_turn", None)),
        ("stop", None, ("end_turn", None)),
        ("stop", "END", ("stop_sequence", "END")),
        ("length", None, ("max_tokens", None)),
    ],
)
def test_stop_reason_and_sequence(finish, stop_reason, expected):
    body = message(META, finished(out("Hi", finish, stop_reason))).dump()
    assert (body["stop_reason"], body["stop_sequence"]) == expected


def test_message_shape_and_usage():
    body = message(META, finished(out("Hel"), out("lo", "stop", 2))).dump()
    assert body == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "smol",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }


def events(batches: list, parsing: OutputParsing | None = None) -> list[tuple[str, dict]]:
    async def gen():
        for batch in batches:
            if isinstance(batch, Exception):
                raise batch
            yield 0, batch

    async def run():
        state = ChoiceState(0, num_prompt_tokens=5)
        return [frame async for frame in message_events(META, state, gen(), parsing)]

    parsed = []
    for frame in asyncio.run(run()):
        event_line, data_line, blank = frame.split("\n", 2)
        assert event_line.startswith("event: ") and data_line.startswith("data: ") and blank == "\n"
        name, data = event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert name == data["type"]
        parsed.append((name, data))
    return parsed


def test_stream_follows_anthropic_event_order():
    parsed = events([[out("Hel")], [out("")], [out("lo", "stop", "END")]])
    assert [name for name, _ in parsed] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = parsed[0][1]["message"]
    assert start["content"] == [] and start["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert parsed[1][1]["content_block"] == {"type": "text", "text": ""}
    assert [d["delta"] for _, d in parsed[3:5]] == [
        {"type": "text_delta", "text": "Hel"},
        {"type": "text_delta", "text": "lo"},
    ]
    delta = parsed[6][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"] == {"output_tokens": 3}  # one token per batch, the empty one too


def test_failure_mid_stream_is_one_error_event_then_the_end():
    parsed = events([[out("Hel")], [out("", "error")]])
    assert [name for name, _ in parsed][-2:] == ["content_block_delta", "error"]
    assert parsed[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "the request failed in the engine"},
    }


def test_unexpected_exception_mid_stream_is_an_api_error_event():
    parsed = events([[out("Hel")], RuntimeError("boom")])
    assert parsed[-1][0] == "error" and "boom" in parsed[-1][1]["error"]["message"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_types_by_status(status, kind):
    assert error_type(status) == kind
    assert error_body(ApiError(status, "m")) == {"type": "error", "error": {"type": kind, "message": "m"}}


HERMES = OutputParsing(make_format("hermes", TOOLS), frozenset(tool["name"] for tool in TOOLS))
CUT_CALL = ["<tool_call>", '\n{"name": "get_weather", "arguments": ', '{"city": "Paris", "unit": "cel']


def _cut(pieces: list[str]) -> list[list[RequestOutput]]:
    return [[out(piece, "length" if n == len(pieces) else None)] for n, piece in enumerate(pieces, 1)]


def _blocks(parsed: list[tuple[str, dict]]) -> list[dict]:
    """The streamed content blocks, each with its deltas joined, as a client assembles them."""
    blocks: list[dict] = []
    for name, data in parsed:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"], partial_json=""))
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                block["partial_json"] += delta["partial_json"]
    return blocks


def test_a_tool_use_cut_by_max_tokens_keeps_its_input_so_far_streamed_or_whole():
    parsed = events(_cut(["Checking.\n", *CUT_CALL]), HERMES)
    text, use = _blocks(parsed)
    assert text["text"] == "Checking.\n" and "<tool" not in text["text"]
    assert use["name"] == "get_weather" and use["partial_json"] == '{"city": "Paris", "unit": "cel'
    assert parsed[-2][1]["delta"]["stop_reason"] == "max_tokens"
    body = message(META, finished(*[o for batch in _cut(["Checking.\n", *CUT_CALL]) for o in batch]), HERMES)
    text, use = body.dump()["content"]
    assert body.stop_reason == "max_tokens" and text == {"type": "text", "text": "Checking.\n"}
    assert use["name"] == "get_weather" and use["input"] == {"city": "Paris"}  # as the SDKs read the stream


def test_a_tool_use_cut_before_its_name_is_dropped_not_sent_as_text():
    pieces = ["<tool_call>", '\n{"name": "get_we']
    parsed = events(_cut(pieces), HERMES)
    assert _blocks(parsed) == [{"type": "text", "text": "", "partial_json": ""}]
    assert parsed[-2][1]["delta"]["stop_reason"] == "max_tokens"
    body = message(META, finished(*[o for batch in _cut(pieces) for o in batch]), HERMES).dump()
    assert body["content"] == [{"type": "text", "text": ""}] and body["stop_reason"] == "max_tokens"
