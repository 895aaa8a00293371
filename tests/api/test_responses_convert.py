"""Responses requests -> neutral inputs: input items as turns, instructions, tools, sampling; the
documented no-ops are accepted, the refused fields are 400s naming them."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.output_parser import OutputParsing
from api.responses_convert import (
    chat_prompt,
    check_logprobs,
    check_supported,
    input_turns,
    sampling_params,
)
from api.responses_outputs import settings
from api.responses_schemas import ResponsesRequest

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "default", "input": "hi", **fields})


def rejected(**fields) -> ApiError:
    with pytest.raises(ApiError) as err:
        check_supported(request(**fields))
    return err.value


def test_sampling_defaults_and_fields():
    assert sampling_params(request()).max_tokens is None
    params = sampling_params(request(max_output_tokens=9, temperature=0.2, top_p=0.5))
    assert (params.max_tokens, params.temperature, params.top_p) == (9, 0.2, 0.5)


def test_string_input_is_one_user_turn_after_the_instructions():
    req = request(instructions="Be brief.")
    prompt = chat_prompt(req, input_turns(req))
    assert prompt.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert prompt.add_generation_prompt and prompt.tools is None


def test_message_items_with_and_without_type():
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "b", "annotations": []}],
        },
        {"role": "user", "content": "c"},
    ]
    assert input_turns(request(input=items)) == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]


def test_function_calls_and_outputs_become_tool_turns():
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "4C"},
    ]
    turns = input_turns(request(input=items, tools=[TOOL]))
    assert [call["id"] for call in turns[1]["tool_calls"]] == ["c1", "c2"]
    assert turns[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert turns[2] == {"role": "tool", "tool_call_id": "c1", "content": "4C"}


def test_bad_function_call_arguments_are_a_400():
    items = [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{nope"}]
    with pytest.raises(ApiError) as err:
        input_turns(request(input=items))
    assert err.value.param == "input[0].arguments"


def test_tools_pass_to_the_template_unless_tool_choice_none():
    assert chat_prompt(request(tools=[TOOL]), []).tools[0]["function"]["name"] == "get_weather"
    assert chat_prompt(request(tools=[TOOL], tool_choice="none"), []).tools is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forcing_a_tool_is_accepted(choice):
    check_supported(request(tools=[TOOL], tool_choice=choice))


def test_reasoning_items_become_the_next_assistant_turns_reasoning():
    items = [
        {"role": "user", "content": "weather?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    ]
    turns = input_turns(request(input=items, tools=[TOOL]))
    assert len(turns) == 2 and turns[1]["reasoning_content"] == "hmm" and turns[1]["content"] == "Checking."
    assert turns[1]["tool_calls"][0]["id"] == "c1"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"include": ["reasoning.encrypted_content", "output_text.everything"]}, "include[1]"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "https://x"}]}, "tools[0].server_url"),
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0]"),
        ({"tools": [{"type": "local_shell"}]}, "tools[0]"),
        (
            {
                "tools": [
                    {"type": "namespace", "name": "ns", "tools": [TOOL, {"type": "custom", "name": "x"}]}
                ]
            },
            "tools[0].tools[1]",
        ),
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]},
            "input[0].encrypted_content",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].file_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "x", "detail": "low"}]}
                ]
            },
            "input[0].content[0].detail",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
    ],
)
def test_unhonoured_fields_are_400s_naming_them(fields, param):
    err = rejected(**fields)
    assert err.status == 400 and err.param == param


def test_unknown_item_type_fails_validation():
    with pytest.raises(ValueError):
        request(input=[{"type": "web_search_call", "id": "ws_1"}])


def test_input_images_become_image_parts_and_urls_also_from_a_stored_conversation():
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}
    first = request(input=[{"role": "user", "content": [image, {"type": "input_text", "text": "What?"}]}])
    check_supported(first)
    stored = input_turns(first)  # what the response store keeps for previous_response_id
    follow_up = request(
        input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/b.png"}]}
        ]
    )
    prompt = chat_prompt(
        follow_up, [*stored, {"role": "assistant", "content": "A cat."}, *input_turns(follow_up)]
    )
    assert prompt.messages == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "image"}]},
    ]
    assert prompt.image_urls == ("data:image/png;base64,AAAA", "https://example.com/b.png")


CODEX_NO_OPS = {
    "client_metadata": {"x-codex-installation-id": "i", "session_id": "s"},
    "store": False,
    "prompt_cache_key": "thread-1",
    "safety_identifier": "user-1",
    "service_tier": "flex",
    "parallel_tool_calls": False,
    "truncation": "auto",
    "include": ["reasoning.encrypted_content", "web_search_call.action.sources", "file_search_call.results"],
    "reasoning": {"effort": "medium", "summary": "auto"},
    "text": {"verbosity": "low"},
    "user": "u",
}


def test_codex_no_op_fields_are_accepted_and_change_neither_prompt_nor_sampling():
    plain, codex = request(), request(**CODEX_NO_OPS)
    check_supported(codex)
    prompt, plain_prompt = chat_prompt(codex, input_turns(codex)), chat_prompt(plain, input_turns(plain))
    assert (prompt.messages, prompt.tools) == (plain_prompt.messages, plain_prompt.tools)
    assert sampling_params(codex) == sampling_params(plain)
    # The effort reaches templates that read it (gpt-oss style), as chat completions' reasoning_effort.
    assert prompt.template_kwargs == {"reasoning_effort": "medium"} and plain_prompt.template_kwargs == {}


def test_the_response_echoes_what_it_served():
    echo = settings(request(**CODEX_NO_OPS))
    assert echo["service_tier"] == "default" and echo["truncation"] == "auto" and echo["store"] is False
    assert echo["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert echo["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert echo["prompt_cache_key"] == "thread-1" and echo["parallel_tool_calls"] is False
    assert settings(request())["truncation"] == "disabled"


HOSTED = [
    {"type": "web_search"},
    {"type": "web_search_preview", "search_context_size": "low"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "computer_use_preview", "display_width": 1, "display_height": 1, "environment": "linux"},
    {"type": "mcp", "server_label": "apps", "connector_id": "connector_gmail"},
    {"type": "tool_search"},
]


def test_hosted_tools_are_dropped_from_the_prompt_and_echoed():
    req = request(tools=[*HOSTED, TOOL])
    check_supported(req)
    assert [t["function"]["name"] for t in chat_prompt(req, []).tools] == ["get_weather"]
    assert [t["type"] for t in settings(req)["tools"]] == [t["type"] for t in [*HOSTED, TOOL]]
    only_hosted = request(tools=HOSTED)
    check_supported(only_hosted)
    assert chat_prompt(only_hosted, []).tools is None


NAMESPACE = {
    "type": "namespace",
    "name": "mcp__files",
    "description": "Tools in the mcp__files namespace.",
    "tools": [
        {"type": "function", "name": "read", "description": "Read a file", "strict": False, "parameters": {}},
        {"type": "function", "name": "list", "defer_loading": True, "parameters": {"type": "object"}},
    ],
}


def test_namespace_tools_reach_the_template_flattened():
    req = request(tools=[TOOL, NAMESPACE])
    check_supported(req)
    functions = [t["function"] for t in chat_prompt(req, []).tools]
    assert [f["name"] for f in functions] == ["get_weather", "mcp__files__read", "mcp__files__list"]
    assert functions[1]["description"] == "Read a file\n\nmcp__files: Tools in the mcp__files namespace."


def test_namespaced_calls_sent_back_take_the_flattened_name():
    items = [
        {"role": "user", "content": "list"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "list",
            "namespace": "mcp__files",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    ]
    turns = input_turns(request(input=items, tools=[NAMESPACE]))
    assert turns[1]["tool_calls"][0]["function"]["name"] == "mcp__files__list"


LOGPROBS = {"include": ["message.output_text.logprobs"]}


def test_logprobs_are_asked_of_the_engine_when_included():
    assert sampling_params(request()).logprobs is None
    assert sampling_params(request(**LOGPROBS)).logprobs == 0
    assert sampling_params(request(**LOGPROBS, top_logprobs=3)).logprobs == 3
    assert sampling_params(request(top_logprobs=2)).logprobs == 2


def test_logprobs_with_parsed_output_are_a_400():
    check_logprobs(request(**LOGPROBS), OutputParsing())
    with pytest.raises(ApiError) as err:
        check_logprobs(request(**LOGPROBS), OutputParsing(reasoning_parser="qwen3"))
    assert err.value.status == 400 and err.value.param == "include"
