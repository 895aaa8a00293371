"""Function calling on the Responses route of the real app, through the official openai SDK.

The bundled SmolLM2 seldom calls a tool by itself, so these tests force the call (`required` or a named
function): the grammar guarantees a call to an offered tool with schema-valid JSON arguments.
"""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
CITY = {"type": "string", "enum": ["Paris", "London", "Tokyo"]}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": CITY},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {**WEATHER, "name": "get_time", "description": "The local time in a city"}
ASK = "What is the weather in Paris?"
FORCED = [("required", {"get_weather", "get_time"}), ({"type": "function", "name": "get_time"}, {"get_time"})]


def create(client, **kwargs):
    fields = {
        "model": MODEL,
        "input": ASK,
        "tools": [WEATHER, TIME],
        "max_output_tokens": 60,
        "temperature": 0,
    }
    return client.responses.create(**{**fields, **kwargs})


def function_calls(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


def shape(response) -> list[dict]:
    """The output without ids, which differ between two responses."""
    items = [item.model_dump(exclude_none=True) for item in response.output]
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize(("choice", "names"), FORCED)
def test_forced_call_is_a_function_call_item(client, choice, names):
    response = create(client, tool_choice=choice, parallel_tool_calls=False)
    [call] = function_calls(response)
    assert call.name in names and call.status == "completed" and response.status == "completed"
    assert json.loads(call.arguments)["city"] in CITY["enum"]
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert response.tool_choice is not None and response.parallel_tool_calls is False


def test_streamed_call_events_in_order_and_equal_to_the_whole(client):
    events = list(create(client, tool_choice="required", parallel_tool_calls=False, stream=True))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    added = next(
        e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"
    )
    assert added.item.arguments == ""
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    item_done = next(
        e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"
    )
    assert types.index(added.type) < types.index(deltas[0].type) and deltas
    assert types.index(done.type) < types.index(item_done.type)
    assert "".join(d.delta for d in deltas) == done.arguments == item_done.item.arguments
    assert all(e.item_id == added.item.id for e in [*deltas, done])
    assert not any("<tool_call>" in e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert shape(final) == shape(create(client, tool_choice="required", parallel_tool_calls=False))


def test_stream_helper_accumulates_the_call(client):
    with client.responses.stream(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    [call] = function_calls(final)
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in CITY["enum"]


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_output_round_trip_with_previous_response_id(client, stream):
    # One call and nothing else, so the explicit resend below is the whole conversation.
    forced = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    first = create(client, **forced)
    if stream:
        first = list(create(client, **forced, stream=True))[-1].response
    [call] = function_calls(first)
    follow_up = create(
        client,
        tools=[WEATHER],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
        max_output_tokens=16,
    )
    assert follow_up.status in ("completed", "incomplete") and follow_up.output
    assert follow_up.previous_response_id == first.id
    # The stored turn holds the call: resending the whole conversation explicitly gives the same prompt.
    explicit = create(
        client,
        tools=[WEATHER],
        input=[
            {"role": "user", "content": ASK},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
        ],
        max_output_tokens=16,
    )
    assert follow_up.usage.input_tokens == explicit.usage.input_tokens
    assert shape(follow_up) == shape(explicit)


def test_output_items_sent_back_as_input_are_accepted(client):
    # One call: with parallel calls allowed, `required` lets the model repeat it.
    first = create(client, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    [call] = function_calls(first)
    items = [{"role": "user", "content": ASK}, *[item.model_dump(exclude_none=True) for item in first.output]]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"})
    follow_up = create(client, tools=[WEATHER], input=items, max_output_tokens=8)
    assert follow_up.output


def test_unknown_named_tool_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        create(client, tool_choice={"type": "function", "name": "get_stock_price"})
    assert err.value.param == "tool_choice" and "get_stock_price" in err.value.message


def test_tool_choice_none_reads_no_calls(client):
    response = create(client, tool_choice="none", max_output_tokens=16)
    assert not function_calls(response) and response.output[0].type == "message"


# What Codex CLI sends with wire_api "responses": its tools grouped in a namespace, a hosted tool it
# expects OpenAI to run, and fields that cannot change this server's output.
NAMESPACE = {
    "type": "namespace",
    "name": "weather",
    "description": "Tools in the weather namespace.",
    "tools": [{**WEATHER, "strict": False}, {**TIME, "defer_loading": True}],
}
CODEX = {
    "model": MODEL,
    "instructions": "You are a coding agent.",
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}],
    "tools": [NAMESPACE, {"type": "web_search"}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1",
    "client_metadata": {"x-codex-installation-id": "install-1", "session_id": "session-1"},
    "text": {"verbosity": "medium"},
    "max_output_tokens": 24,
    "temperature": 0,
}


def sse_events(http, body: dict) -> list[dict]:
    with http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_a_codex_shaped_request_is_served_whole_and_streamed(http):
    response = http.post("/v1/responses", json=CODEX)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] in ("completed", "incomplete") and body["output"]
    assert [t["type"] for t in body["tools"]] == ["namespace", "web_search"]  # echoed, web_search not run
    assert not [item for item in body["output"] if item["type"] == "web_search_call"]
    assert body["service_tier"] == "default" and body["store"] is False
    events = sse_events(http, {**CODEX, "stream": True})
    assert events[0]["type"] == "response.created" and events[-1]["type"] in (
        "response.completed",
        "response.incomplete",
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_a_forced_namespace_tool_is_called_under_its_own_name_and_sent_back(http):
    forced = {**CODEX, "tool_choice": {"type": "function", "name": "get_time", "namespace": "weather"}}
    forced["max_output_tokens"] = 60  # room for the whole call
    first = http.post("/v1/responses", json={**forced, "store": True}).json()
    [call] = [item for item in first["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("get_time", "weather")
    assert json.loads(call["arguments"])["city"] in CITY["enum"]
    streamed = sse_events(http, {**forced, "stream": True})
    [done] = [e["item"] for e in streamed if e["type"] == "response.output_item.done"]
    assert (done["name"], done["namespace"]) == ("get_time", "weather")
    # The call sent back (namespace and all) renders as the stored turn did: the same prompt.
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "09:00"}
    follow_up = {**CODEX, "max_output_tokens": 4, "store": True}
    chained = http.post(
        "/v1/responses", json={**follow_up, "previous_response_id": first["id"], "input": [output]}
    ).json()
    resent = http.post(
        "/v1/responses", json={**follow_up, "input": [*CODEX["input"], *first["output"], output]}
    ).json()
    assert chained["usage"]["input_tokens"] == resent["usage"]["input_tokens"]
