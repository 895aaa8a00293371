"""Responses output items from parsed output: order, ids, whitespace, parallel calls, stream events that
add up to the whole response, and the turn a follow-up continues from."""

from __future__ import annotations

import asyncio
import json

from engine.messages import RequestOutput

from api.choice_state import ChoiceState
from api.output_parser import OutputParser, OutputParsing
from api.responses_items import OutputItems, assistant_turns, whole_output
from api.responses_outputs import ResponseMeta, settings
from api.responses_schemas import ResponsesRequest
from api.responses_stream import response_events
from api.responses_tools import ToolNames
from api.tool_parsers import make_format

META = ResponseMeta("resp_1", "msg_1", 100, "smol")
TOOLS = [
    {"name": "get_weather", "description": None, "parameters": {"type": "object"}},
    {"name": "get_time", "description": None, "parameters": {"type": "object"}},
]
NAMES = frozenset(tool["name"] for tool in TOOLS)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_2 = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'


def parsing(reasoning: str | None = None) -> OutputParsing:
    return OutputParsing(make_format("hermes", TOOLS), NAMES, reasoning)


def finished(text: str, finish: str = "stop") -> ChoiceState:
    state = ChoiceState(0, num_prompt_tokens=5)
    state.add([RequestOutput("resp_1", [1], text, finish, num_prompt_tokens=5)])
    return state


def shape(items) -> list[dict]:
    """Items without their random ids (a call's item id still has to follow its call id)."""
    out = []
    for item in items:
        body = item.model_dump() if not isinstance(item, dict) else dict(item)
        if body["type"] == "function_call":
            assert body["id"] == "fc_" + body.pop("call_id").removeprefix("call_")
        if body["type"] != "message":
            body.pop("id")
        out.append(body)
    return out


def test_reasoning_then_text_then_call_in_the_order_produced():
    output = whole_output(META, finished(f"<think>hmm</think>Let me check.\n{CALL}"), parsing("qwen3"))
    assert shape(output) == [
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
            "status": "completed",
        },
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Let me check.\n", "annotations": [], "logprobs": []}
            ],
        },
        {
            "type": "function_call",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
    ]


def test_whitespace_between_calls_opens_no_message():
    output = whole_output(META, finished(f"\n{CALL}\n{CALL_2}\n"), parsing())
    assert [(item.type, getattr(item, "name", None)) for item in output] == [
        ("function_call", "get_weather"),
        ("function_call", "get_time"),
    ]
    assert json.loads(output[1].arguments) == {"tz": "UTC"}


def test_parallel_false_keeps_the_first_call_only():
    output = whole_output(META, finished(f"{CALL}\n{CALL_2}"), parsing(), parallel=False)
    assert [item.name for item in output] == ["get_weather"]


def test_plain_or_empty_output_is_one_message():
    for text in ("Hi there", ""):
        output = whole_output(META, finished(text), parsing())
        assert len(output) == 1 and output[0].id == "msg_1" and output[0].content[0].text == text


def test_unknown_tool_stays_text_and_cut_short_output_is_incomplete():
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    output = whole_output(META, finished(text), parsing())
    assert [item.type for item in output] == ["message"] and output[0].content[0].text == text
    cut = whole_output(
        META, finished('<tool_call>\n{"name": "get_weather", "arguments": {"ci', "length"), parsing()
    )
    assert cut[-1].status == "incomplete"


def test_assistant_turns_carry_text_calls_and_reasoning():
    output = whole_output(META, finished(f"<think>hmm</think>Ok.\n{CALL}"), parsing("qwen3"))
    [turn] = assistant_turns(output)
    assert turn["content"] == "Ok.\n" and turn["reasoning_content"] == "hmm"
    assert turn["tool_calls"][0]["id"] == output[2].call_id
    assert turn["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}


def streamed(text: str, reasoning: str | None = None, size: int = 3):
    events: list[tuple[str, dict]] = []

    def event(name: str, **fields):
        events.append((name, fields))
        return name

    items, parser = OutputItems(META, event), OutputParser(parsing(reasoning))
    for i in range(0, len(text), size):
        items.frames(parser.feed(text[i : i + size]))
    items.frames(parser.finish())
    items.close("completed")
    return items.output, events


def test_streamed_items_equal_the_whole_reading():
    text = f"<think>hmm</think>Let me check.\n{CALL}\n{CALL_2}"
    for size in (1, 3, 7, len(text)):
        output, _ = streamed(text, "qwen3", size)
        assert shape(output) == shape(whole_output(META, finished(text), parsing("qwen3")))


def test_call_events_in_order_with_deltas_adding_up():
    output, events = streamed(f"Sure.{CALL}")
    names = [name for name, _ in events if not name.endswith(".delta")]
    assert names[-6:] == [
        "response.output_text.done",  # the message ends when the call begins
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    all_names = [name for name, _ in events]
    first_delta = all_names.index("response.function_call_arguments.delta")
    assert all_names.index("response.output_item.added", 2) < first_delta
    assert all_names[first_delta:-2] == ["response.function_call_arguments.delta"] * (
        len(all_names) - first_delta - 2
    )
    added = next(
        f for n, f in events if n == "response.output_item.added" and f["item"]["type"] == "function_call"
    )
    assert (
        added["output_index"] == 1
        and added["item"]["arguments"] == ""
        and added["item"]["status"] == "in_progress"
    )
    deltas = "".join(f["delta"] for n, f in events if n == "response.function_call_arguments.delta")
    done = next(f for n, f in events if n == "response.function_call_arguments.done")
    assert deltas == done["arguments"] == output[1].arguments == '{"city": "Paris"}'
    assert all(
        f["item_id"] == output[1].id for n, f in events if n.startswith("response.function_call_arguments")
    )
    text = "".join(f["delta"] for n, f in events if n == "response.output_text.delta")
    assert text == "Sure." and "<" not in text


def test_reasoning_events():
    _, events = streamed("<think>mull it</think>Yes.", "qwen3")
    names = [name for name, _ in events]
    assert names[:2] == ["response.output_item.added", "response.content_part.added"]
    assert events[1][1]["part"] == {"type": "reasoning_text", "text": ""}
    deltas = "".join(f["delta"] for n, f in events if n == "response.reasoning_text.delta")
    done = next(f for n, f in events if n == "response.reasoning_text.done")
    assert deltas == done["text"] == "mull it" and done["content_index"] == 0 and done["output_index"] == 0


def test_response_events_parsed_stream_ends_with_the_whole_shape():
    echo = settings(ResponsesRequest.model_validate({"model": "default", "input": "hi"}))
    text = f"Sure.{CALL}"
    remembered: list = []

    async def gen():
        for i in range(0, len(text), 4):
            yield 0, [RequestOutput("resp_1", [1], text[i : i + 4], "stop" if i + 4 >= len(text) else None)]

    async def remember(output):
        remembered.append(output)

    async def run():
        state = ChoiceState(0, num_prompt_tokens=5)
        return [f async for f in response_events(META, echo, state, gen(), remember, parsing())]

    frames = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in asyncio.run(run())]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    assert [f["type"] for f in frames[:2]] == ["response.created", "response.in_progress"]
    final = frames[-1]
    assert final["type"] == "response.completed"
    assert shape(final["response"]["output"]) == shape(whole_output(META, finished(text), parsing()))
    assert [item.type for item in remembered[0]] == ["message", "function_call"]


def test_a_namespaced_call_comes_back_under_its_own_name_and_namespace():
    tools = [{"name": "crm__find", "description": None, "parameters": {"type": "object"}}]
    reading = OutputParsing(make_format("hermes", tools), frozenset({"crm__find"}))
    call = '<tool_call>\n{"name": "crm__find", "arguments": {"q": "x"}}\n</tool_call>'
    names = ToolNames({"crm__find": ("crm", "find")})
    [item] = whole_output(META, finished(call), reading, names=names)
    assert (item.name, item.namespace) == ("find", "crm") and item.model_dump()["namespace"] == "crm"
    # The follow-up's turn names the call as the model wrote it.
    [turn] = assistant_turns([item])
    assert turn["tool_calls"][0]["function"]["name"] == "crm__find"
    # A call to a plain tool carries no namespace key at all.
    [plain] = whole_output(META, finished(CALL), parsing())
    assert "namespace" not in plain.model_dump()
