"""Tool calling on the real app with the bundled model, through the openai and anthropic SDKs.

SmolLM2's template renders no tools, so they go into the system prompt in the Hermes format and the
`auto` parser is hermes. The tiny model seldom calls a tool by itself: forcing modes (OpenAI `required`
and named, Anthropic `any` and `tool`) must produce a call anyway, by constrained decoding.
"""

from __future__ import annotations

import json

import anthropic
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "string", "enum": ["Paris", "London", "Tokyo"]}
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": CITY, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"city": CITY},
    "required": ["city"],
    "additionalProperties": False,
}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER_SCHEMA},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Local time", "parameters": TIME_SCHEMA},
    },
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Weather now", "input_schema": WEATHER_SCHEMA},
    {"name": "get_time", "description": "Local time", "input_schema": TIME_SCHEMA},
]
FORCED_OPENAI = [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
]
FORCED_ANTHROPIC = [
    ({"type": "any"}, {"get_weather", "get_time"}),
    ({"type": "tool", "name": "get_time"}, {"get_time"}),
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}


def _valid_arguments(name: str, arguments: dict) -> bool:
    schema = SCHEMAS[name]
    return set(arguments) == set(schema["required"]) and all(
        arguments[key] in schema["properties"][key]["enum"] for key in arguments
    )


@pytest.fixture(scope="module")
def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def _chat(client, **kwargs):
    fields = {
        "model": MODEL,
        "messages": ASK,
        "tools": OPENAI_TOOLS,
        "max_tokens": 60,
        "temperature": 0,
        **kwargs,
    }
    return client.chat.completions.create(**fields)


# --- OpenAI ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("choice", "names"), FORCED_OPENAI)
def test_openai_forced_choice_returns_a_parseable_call(client, choice, names):
    choice_out = _chat(client, tool_choice=choice, parallel_tool_calls=False).choices[0]
    assert choice_out.finish_reason == "tool_calls"
    [call] = choice_out.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
    assert _valid_arguments(call.function.name, json.loads(call.function.arguments))
    assert not choice_out.message.content


@pytest.mark.parametrize(("choice", "names"), FORCED_OPENAI)
def test_openai_forced_choice_streams_the_call_as_deltas(client, choice, names):
    chunks = list(_chat(client, tool_choice=choice, parallel_tool_calls=False, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    first = deltas[0]
    assert first.id.startswith("call_") and first.type == "function" and first.function.name in names
    assert all(d.index == 0 for d in deltas) and all(d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert _valid_arguments(first.function.name, json.loads(arguments))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_openai_stream_and_whole_agree_on_the_forced_call(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = _chat(client, tool_choice=choice, parallel_tool_calls=False).choices[0].message.tool_calls
    chunks = list(_chat(client, tool_choice=choice, parallel_tool_calls=False, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in whole] == [d.function.name for d in deltas if d.function.name]
    assert whole[0].function.arguments == "".join(d.function.arguments or "" for d in deltas if d.index == 0)


def test_openai_none_and_auto_answer_without_forcing(client):
    for choice in ("none", "auto"):
        message = _chat(client, tool_choice=choice, max_tokens=12).choices[0].message
        if choice == "none":
            assert message.tool_calls is None and message.content
        for call in message.tool_calls or []:  # auto: whatever the model does must parse
            assert call.function.name in SCHEMAS
            json.loads(call.function.arguments)


def test_openai_tool_result_round_trip(client):
    call = _chat(client, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
    ]
    answer = _chat(client, messages=history, max_tokens=16)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens > _chat(client, max_tokens=1).usage.prompt_tokens


def test_openai_unknown_named_tool_is_a_400(client):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.param == "tool_choice"


# --- Anthropic ---------------------------------------------------------------------------------


def _messages(claude, **kwargs):
    fields = {"model": MODEL, "messages": ASK, "tools": ANTHROPIC_TOOLS, "max_tokens": 60, **kwargs}
    return claude.messages.create(**fields, extra_body={"temperature": 0})


@pytest.mark.parametrize(("choice", "names"), FORCED_ANTHROPIC)
def test_anthropic_forced_choice_returns_tool_use(claude, choice, names):
    message = _messages(claude, tool_choice={**choice, "disable_parallel_tool_use": True})
    assert message.stop_reason == "tool_use"
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name in names and _valid_arguments(use.name, use.input)


@pytest.mark.parametrize(("choice", "names"), FORCED_ANTHROPIC)
def test_anthropic_forced_choice_streams_input_json_deltas(claude, choice, names):
    tool_choice = {**choice, "disable_parallel_tool_use": True}
    with claude.messages.stream(
        model=MODEL, messages=ASK, tools=ANTHROPIC_TOOLS, max_tokens=60, tool_choice=tool_choice
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    [use] = [b for b in final.content if b.type == "tool_use"]
    assert use.name in names and _valid_arguments(use.name, use.input)
    assert final.stop_reason == "tool_use"


def test_anthropic_tool_result_round_trip(claude):
    use = next(b for b in _messages(claude, tool_choice={"type": "any"}).content if b.type == "tool_use")
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny."}]},
    ]
    answer = _messages(claude, messages=history, max_tokens=16)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content


def test_anthropic_tool_choice_none_calls_nothing(claude):
    message = _messages(claude, tool_choice={"type": "none"}, max_tokens=12)
    assert [b.type for b in message.content] == ["text"] and message.stop_reason != "tool_use"


# --- Cut by max_tokens, or forced to one named tool ---------------------------------------------

# Where a forced call's SmolLM2 tokens end at these max_tokens: inside the `<tool_call>` opener, before
# the tool's name is complete, inside the arguments.
CUT_AT = [3, 9, 20]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in OPENAI_TOOLS]


def _anthropic_stream(claude, **kwargs):
    fields = {"model": MODEL, "messages": ASK, "tools": ANTHROPIC_TOOLS, "max_tokens": 60, **kwargs}
    with claude.messages.stream(**fields, extra_body={"temperature": 0}) as stream:
        return list(stream), stream.get_final_message()


def _blocks(message) -> list[tuple]:
    return [
        (b.type, getattr(b, "text", None), getattr(b, "name", None), getattr(b, "input", None))
        for b in message.content
    ]


@pytest.mark.parametrize("max_tokens", CUT_AT)
def test_openai_call_cut_by_max_tokens_finishes_length_with_no_markup(client, max_tokens):
    whole = _chat(client, tool_choice="required", max_tokens=max_tokens).choices[0]
    assert whole.finish_reason == "length" and not whole.message.content
    calls = whole.message.tool_calls or []
    chunks = list(_chat(client, tool_choice="required", max_tokens=max_tokens, stream=True))
    choices = [c.choices[0] for c in chunks if c.choices]
    deltas = [tc for c in choices for tc in c.delta.tool_calls or []]
    assert "".join(c.delta.content or "" for c in choices) == "" and choices[-1].finish_reason == "length"
    assert [d.function.name for d in deltas if d.function.name] == [c.function.name for c in calls]
    assert "".join(d.function.arguments or "" for d in deltas) == "".join(c.function.arguments for c in calls)
    if max_tokens == CUT_AT[-1]:  # the name is out: the call comes, with its arguments so far
        assert calls and calls[0].function.name in SCHEMAS


@pytest.mark.parametrize("max_tokens", CUT_AT)
def test_anthropic_tool_use_cut_by_max_tokens_stops_at_max_tokens_with_no_markup(claude, max_tokens):
    whole = _messages(claude, tool_choice={"type": "any"}, max_tokens=max_tokens)
    _, streamed = _anthropic_stream(claude, tool_choice={"type": "any"}, max_tokens=max_tokens)
    for message in (whole, streamed):
        assert message.stop_reason == "max_tokens"
        assert all(not b.text for b in message.content if b.type == "text")
    assert _blocks(whole) == _blocks(streamed)
    if max_tokens == CUT_AT[-1]:
        assert next(b.name for b in whole.content if b.type == "tool_use") in SCHEMAS


@pytest.mark.parametrize("max_tokens", CUT_AT)
def test_responses_call_cut_by_max_output_tokens_is_incomplete_with_no_markup(client, max_tokens):
    fields = {
        "model": MODEL,
        "input": ASK[0]["content"],
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "max_output_tokens": max_tokens,
        "temperature": 0,
    }
    whole = client.responses.create(**fields)
    streamed = [e for e in client.responses.create(**fields, stream=True)][-1]
    assert streamed.type == "response.incomplete"
    for response in (whole, streamed.response):
        assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
        texts = [part.text for item in response.output if item.type == "message" for part in item.content]
        assert all(not text for text in texts)
    calls = [(i.name, i.arguments) for i in whole.output if i.type == "function_call"]
    assert calls == [(i.name, i.arguments) for i in streamed.response.output if i.type == "function_call"]


def test_anthropic_named_tool_streams_exactly_one_tool_use(claude):
    # Parallel tool use stays allowed: the tool choice alone must keep the model from calling again.
    events, final = _anthropic_stream(
        claude, tool_choice={"type": "tool", "name": "get_time"}, max_tokens=120
    )
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert [e.content_block.name for e in starts] == ["get_time"]
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use"
    assert _valid_arguments("get_time", final.content[0].input)


def test_openai_and_responses_named_tool_stream_exactly_one_call(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    chunks = list(_chat(client, tool_choice=choice, max_tokens=120, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert {d.index for d in deltas} == {0} and [d.function.name for d in deltas if d.function.name] == [
        "get_time"
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    events = list(
        client.responses.create(
            model=MODEL,
            input=ASK[0]["content"],
            tools=RESPONSES_TOOLS,
            tool_choice={"type": "function", "name": "get_time"},
            max_output_tokens=120,
            temperature=0,
            stream=True,
        )
    )
    final = events[-1].response
    assert [i.name for i in final.output if i.type == "function_call"] == ["get_time"]
    assert final.status == "completed"
