"""The real app through the official anthropic SDK: create, stream, count_tokens, stops, errors."""

from __future__ import annotations

import json

import anthropic
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
HELLO = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0}  # SDK 2.x has no sampling kwargs; the API still takes them
STREAM_EVENTS = ["message_start", "content_block_start", "ping"]
CLOSING_EVENTS = ["content_block_stop", "message_delta", "message_stop"]


@pytest.fixture(scope="module")
def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def create(claude, **kwargs):
    fields = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "extra_body": GREEDY, **kwargs}
    return claude.messages.create(**fields)


@pytest.mark.parametrize("model", ["default", MODEL])
def test_create(claude, model):
    message = create(claude, model=model)
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_") and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens > 5 and 0 < message.usage.output_tokens <= 12


def test_stream_matches_create_at_temperature_0(claude):
    with claude.messages.stream(model=MODEL, messages=HELLO, max_tokens=12, extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = create(claude)
    assert streamed == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_count_tokens_equals_usage_input_tokens(claude):
    messages = [
        *HELLO,
        {"role": "assistant", "content": "Red, green, blue."},
        {"role": "user", "content": "More?"},
    ]
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    counted = claude.messages.count_tokens(model=MODEL, messages=messages, system=system)
    message = create(claude, messages=messages, system=system, max_tokens=2)
    assert counted.input_tokens == message.usage.input_tokens


def test_system_as_blocks_equals_the_joined_string(claude):
    blocks = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in English."}]

    def count(**kwargs) -> int:
        return claude.messages.count_tokens(model=MODEL, messages=HELLO, **kwargs).input_tokens

    as_blocks = count(system=blocks)
    assert as_blocks == count(system="You are terse.\nAnswer in English.") != count()
    assert create(claude, system=blocks, max_tokens=2).usage.input_tokens == as_blocks


def test_stop_sequence_cuts_the_text(claude):
    full = create(claude, max_tokens=16).content[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    message = create(claude, max_tokens=16, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert stop not in message.content[0].text and full.startswith(message.content[0].text)


def test_claude_code_max_tokens_beyond_the_context_is_capped_not_refused(claude):
    # Claude Code sends max_tokens 32000 whatever the model; the e2e app serves 1,024 tokens of context.
    message = create(claude, max_tokens=32000, stop_sequences=["\n\n"])
    assert message.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
    assert message.usage.input_tokens + message.usage.output_tokens <= 1024


def test_max_tokens_1_stops_at_max_tokens(claude):
    message = create(claude, max_tokens=1)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 1


def test_tool_history_is_rendered_into_the_prompt(claude):
    tool_turns = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "colors", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "red, teal"}]},
    ]
    messages = [*HELLO, *tool_turns]
    with_tools = claude.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    assert with_tools > claude.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens
    assert create(claude, messages=messages, max_tokens=2).usage.input_tokens == with_tools


def test_unknown_model_is_404_not_found_error(claude):
    with pytest.raises(anthropic.NotFoundError) as err:
        create(claude, model="claude-opus-4-1")
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "not_found_error"


def test_forcing_an_unknown_tool_is_a_400(claude):
    tool = {"name": "colors", "input_schema": {"type": "object"}}
    with pytest.raises(anthropic.BadRequestError) as err:
        create(claude, tools=[tool], tool_choice={"type": "tool", "name": "shapes"})
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "not in tools" in err.value.body["error"]["message"]


def test_tools_on_a_template_without_tool_support_go_into_the_system_prompt(claude):
    # The bundled SmolLM2 template never mentions `tools`: engine/prompt/chat_template.py describes them.
    tool = {"name": "colors", "input_schema": {"type": "object"}}
    with_tools = claude.messages.count_tokens(model=MODEL, messages=HELLO, tools=[tool]).input_tokens
    assert with_tools > claude.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens + 20


@pytest.mark.parametrize(
    "content", ["{not json", json.dumps({"model": MODEL, "messages": HELLO}), json.dumps({"model": MODEL})]
)
def test_malformed_body_is_an_anthropic_400(http, content):
    response = http.post("/v1/messages", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]


def test_claude_code_headers_and_fields_are_accepted(http):
    headers = {
        "x-api-key": "sk-ant-unused",
        "authorization": "Bearer unused",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "prompt-caching-2024-07-31,fine-grained-tool-streaming-2025-05-14",
    }
    body = {"model": MODEL, "max_tokens": 2, "messages": HELLO, "metadata": {"user_id": "u1"}}
    response = http.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["output_tokens"] <= 2


def test_raw_stream_has_an_event_line_on_every_frame_in_order(http):
    body = {"model": MODEL, "max_tokens": 6, "messages": HELLO, "stream": True, "temperature": 0}
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    frames = [frame for frame in raw.split("\n\n") if frame.strip()]
    names = []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        names.append(event_line.removeprefix("event: "))
        assert json.loads(data_line.removeprefix("data: "))["type"] == names[-1]
    assert names[:3] == STREAM_EVENTS and names[-3:] == CLOSING_EVENTS
    assert set(names[3:-3]) == {"content_block_delta"}
    assert json.loads(frames[-2].split("data: ", 1)[1])["usage"]["output_tokens"] <= 6


def test_openai_routes_keep_openai_errors(http):
    response = http.post("/v1/chat/completions", json={"model": "nope", "messages": HELLO})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_prompt_errors_before_the_stream_are_plain_responses(http):
    # max_tokens is capped to the context (see above), so the error here is a prompt with no room left.
    long_prompt = [{"role": "user", "content": "word " * 1500}]
    body = {"model": MODEL, "max_tokens": 16, "messages": long_prompt, "stream": True}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    assert "context length" in response.json()["error"]["message"]


CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "effort-2025-11-24",
    "x-app": "cli",
    "user-agent": "claude-cli/2.1.0 (external, cli)",
}


def claude_code_body(**fields) -> dict:
    """What Claude Code 2.1.x posts: cache breakpoints, thinking history, a mid-conversation system
    reminder, adaptive thinking, effort, a clear_thinking edit, metadata and a tool."""
    cache = {"type": "ephemeral"}
    read = {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}
    return {
        "model": MODEL,
        "max_tokens": 16,
        "temperature": 0,
        "system": [{"type": "text", "text": "You are a terse assistant.", "cache_control": cache}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Name three colors.", "cache_control": cache}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Primary colors.", "signature": ""},
                    {"type": "text", "text": "Red, green, blue."},
                ],
            },
            {"role": "system", "content": "<system-reminder>Answer in one line.</system-reminder>"},
            {"role": "user", "content": [{"type": "text", "text": "Two more?", "cache_control": cache}]},
        ],
        "tools": [
            {"name": "Read", "description": "Reads a file.", "input_schema": read, "cache_control": cache}
        ],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_abc_account_def_session_ghi"},
        **fields,
    }


def test_a_claude_code_request_is_answered_whole_and_streamed(http):
    response = http.post("/v1/messages", json=claude_code_body(), headers=CLAUDE_CODE_HEADERS)
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["content"] and message["stop_reason"] in ("end_turn", "max_tokens", "tool_use")

    counted = http.post("/v1/messages/count_tokens", json=claude_code_body(), headers=CLAUDE_CODE_HEADERS)
    assert counted.json()["input_tokens"] == message["usage"]["input_tokens"]
    without_reminder = claude_code_body()
    del without_reminder["messages"][2]
    fewer = http.post("/v1/messages/count_tokens", json=without_reminder, headers=CLAUDE_CODE_HEADERS)
    assert fewer.json()["input_tokens"] < message["usage"]["input_tokens"]  # the reminder is rendered

    body = claude_code_body(stream=True)
    with http.stream("POST", "/v1/messages", json=body, headers=CLAUDE_CODE_HEADERS) as streamed:
        assert streamed.status_code == 200
        raw = streamed.read().decode()
    names = [line.removeprefix("event: ") for line in raw.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop" and "error" not in names
    assert "content_block_start" in names
