"""Responses requests -> neutral inputs: input items as turns, instructions, tools, sampling; 400s."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.responses_convert import chat_prompt, check_supported, input_turns, sampling_params
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
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"background": True}, "background"),
        ({"top_logprobs": 2}, "top_logprobs"),
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
