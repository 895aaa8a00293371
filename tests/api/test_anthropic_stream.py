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


def events(batches: list) -> list[tuple[str, dict]]:
    async def gen():
        for batch in batches:
            if isinstance(batch, Exception):
                raise batch
            yield 0, batch

    async def run():
        state = ChoiceState(0, num_prompt_tokens=5)
        return [frame async for frame in message_events(META, state, gen())]

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
