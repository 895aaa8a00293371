"""Responses objects and stream events: status, usage, echoed settings, event order and numbering,
logprobs."""

from __future__ import annotations

import asyncio
import json

from engine.messages import RequestOutput, TokenLogprob

from api.choice_state import ChoiceState
from api.responses_outputs import ResponseMeta, finished_response, settings
from api.responses_schemas import ResponsesRequest
from api.responses_stream import response_events

META = ResponseMeta("resp_1", "msg_1", 100, "smol")
ECHO = settings(ResponsesRequest.model_validate({"model": "default", "input": "hi", "max_output_tokens": 4}))


def out(text: str, finish: str | None = None) -> RequestOutput:
    return RequestOutput("resp_1", [1], text, finish, num_prompt_tokens=5, num_cached_tokens=2)


def test_finished_response_shape():
    state = ChoiceState(0, num_prompt_tokens=5)
    state.add([out("Hi", "stop")])
    body = finished_response(META, ECHO, state).dump()
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert body["output"] == [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}],
        }
    ]
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["input_tokens_details"] == {
        "cached_tokens": 2
    }
    assert body["usage"]["output_tokens"] == 1 and body["usage"]["total_tokens"] == 6
    assert body["max_output_tokens"] == 4 and body["temperature"] == 1.0 and body["store"] is True


def test_length_is_incomplete_at_max_output_tokens():
    state = ChoiceState(0)
    state.add([out("Hi", "length")])
    body = finished_response(META, ECHO, state).dump()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def events(batches: list, finished: list, token_texts=None) -> list[tuple[str, dict]]:
    async def gen():
        for batch in batches:
            if isinstance(batch, Exception):
                raise batch
            yield 0, batch

    async def remember(output):
        finished.append(output)

    async def run():
        state = ChoiceState(0, num_prompt_tokens=5)
        frames = response_events(META, ECHO, state, gen(), remember, token_texts=token_texts)
        return [f async for f in frames]

    parsed = []
    for frame in asyncio.run(run()):
        event_line, data_line, _ = frame.split("\n", 2)
        name, data = event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert name == data["type"]
        parsed.append((name, data))
    assert [data["sequence_number"] for _, data in parsed] == list(range(len(parsed)))
    return parsed


def test_stream_event_order_and_final_text():
    finished: list = []
    parsed = events([[out("Hel")], [out("lo", "stop")]], finished)
    assert [name for name, _ in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert parsed[0][1]["response"]["status"] == "in_progress" and parsed[0][1]["response"]["output"] == []
    assert parsed[6][1]["text"] == "Hello" and parsed[6][1]["item_id"] == "msg_1"
    assert parsed[-1][1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert len(finished) == 1 and finished[0][0].content[0].text == "Hello"


def test_stream_ends_incomplete_at_the_limit():
    parsed = events([[out("Hel", "length")]], [])
    assert parsed[-1][0] == "response.incomplete"
    assert parsed[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_failure_mid_stream_is_response_failed_and_nothing_is_remembered():
    finished: list = []
    parsed = events([[out("Hel")], RuntimeError("boom")], finished)
    assert parsed[-1][0] == "response.failed" and "boom" in parsed[-1][1]["response"]["error"]["message"]
    assert finished == []


TEXTS = {1: "Hel", 2: "lo", 3: "!", 9: "p"}


async def token_texts(ids: set[int]) -> dict[int, str]:
    return {i: TEXTS[i] for i in ids}


def lp(token_id: int, logprob: float) -> TokenLogprob:
    return TokenLogprob(token_id, logprob, [(9, -3.0)])


def test_streamed_logprobs_follow_their_text():
    # Token 2's text is held back by the detokenizer: its logprob goes with the next delta.
    batches = [
        [RequestOutput("resp_1", [1], "Hel", logprobs=[lp(1, -0.5)])],
        [RequestOutput("resp_1", [2], "", logprobs=[lp(2, -0.25)])],
        [RequestOutput("resp_1", [3], "lo!", "stop", logprobs=[lp(3, -1.0)])],
    ]
    finished: list = []
    parsed = events(batches, finished, token_texts)
    deltas = [data for name, data in parsed if name == "response.output_text.delta"]
    assert [[e["token"] for e in d["logprobs"]] for d in deltas] == [["Hel"], ["lo", "!"]]
    assert deltas[0]["logprobs"][0] == {
        "token": "Hel",
        "logprob": -0.5,
        "bytes": list(b"Hel"),
        "top_logprobs": [{"token": "p", "logprob": -3.0, "bytes": [112]}],
    }
    done = next(data for name, data in parsed if name == "response.output_text.done")
    final_part = parsed[-1][1]["response"]["output"][0]["content"][0]
    assert done["logprobs"] == final_part["logprobs"] == [e for d in deltas for e in d["logprobs"]]
    assert [e["logprob"] for e in finished[0][0].content[0].logprobs] == [-0.5, -0.25, -1.0]


def test_no_logprobs_unless_asked_for():
    batches = [[RequestOutput("resp_1", [1], "Hel", "stop", logprobs=[lp(1, -0.5)])]]
    parsed = events(batches, [])
    assert all(data.get("logprobs", []) == [] for name, data in parsed if "output_text" in name)
