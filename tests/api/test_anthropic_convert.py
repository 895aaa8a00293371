"""Anthropic requests -> neutral inputs: prompt turns, tools, sampling; unhonoured fields are 400s."""

from __future__ import annotations

import pytest

from api.anthropic_convert import chat_prompt, check_supported, sampling_params, tool_choice
from api.anthropic_schemas import CountTokensRequest, MessagesRequest
from api.errors import ApiError
from api.template_messages import function_tool

USER = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "description": "Weather now", "input_schema": {"type": "object"}}


def create(**fields) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "default", "max_tokens": 8, "messages": USER, **fields})


def rejected(**fields) -> ApiError:
    with pytest.raises(ApiError) as err:
        check_supported(create(**fields))
    return err.value


def test_sampling_defaults_follow_anthropic():
    params = sampling_params(create())
    assert params.max_tokens == 8 and params.temperature == 1.0 and params.top_p == 1.0
    assert params.top_k is None and params.stop == []


def test_sampling_fields_map_through():
    params = sampling_params(create(temperature=0, top_p=0.5, top_k=7, stop_sequences=["END", "\n\n"]))
    assert (params.temperature, params.top_p, params.top_k) == (0, 0.5, 7)
    assert params.stop == ["END", "\n\n"]


def test_system_string_and_blocks_render_alike():
    blocks = [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Be kind.", "cache_control": {}},
    ]
    as_blocks = chat_prompt(create(system=blocks)).messages
    as_string = chat_prompt(create(system="Be brief.\nBe kind.")).messages
    assert as_blocks == as_string == [{"role": "system", "content": "Be brief.\nBe kind."}, USER[0]]


def test_no_system_turn_without_system():
    assert chat_prompt(create()).messages == USER


def test_multi_turn_text_blocks_join():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ]
    prompt = chat_prompt(create(messages=messages))
    assert [m["content"] for m in prompt.messages] == ["a\nb", "c", "d"]
    assert prompt.add_generation_prompt and not prompt.continue_final_message


def test_final_assistant_message_is_a_prefill():
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    prompt = chat_prompt(create(messages=messages))
    assert prompt.continue_final_message and not prompt.add_generation_prompt
    assert prompt.messages[-1] == {"role": "assistant", "content": "The answer is"}


def test_tool_use_and_tool_result_become_template_tool_turns():
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": "4C"}]},
                {"type": "tool_result", "tool_use_id": "tu_2", "content": "down", "is_error": True},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    turns = chat_prompt(create(messages=messages, tools=[TOOL])).messages
    assert turns[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "tu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            }
        ],
    }
    assert turns[2:] == [
        {"role": "tool", "tool_call_id": "tu_1", "content": "4C"},
        {"role": "tool", "tool_call_id": "tu_2", "content": "Error: down"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_tools_pass_to_the_template_unless_tool_choice_none():
    expected = [function_tool("get_weather", "Weather now", {"type": "object"})]
    assert chat_prompt(create(tools=[TOOL])).tools == expected
    assert chat_prompt(create(tools=[TOOL], tool_choice={"type": "auto"})).tools == expected
    assert chat_prompt(create(tools=[TOOL], tool_choice={"type": "none"})).tools is None
    check_supported(create(tools=[TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": True}))


@pytest.mark.parametrize(
    ("choice", "mode", "named"),
    [
        ({"type": "any"}, "required", None),
        ({"type": "tool", "name": "get_weather"}, "required", "get_weather"),
    ],
)
def test_any_and_tool_force_a_call(choice, mode, named):
    parsed = tool_choice(create(tools=[TOOL], tool_choice=choice))
    assert (parsed.mode, parsed.named, [t["name"] for t in parsed.callable_tools()]) == (
        mode,
        named,
        ["get_weather"],
    )


def test_forcing_an_unknown_tool_is_a_400_naming_tool_choice():
    with pytest.raises(ApiError) as err:
        tool_choice(create(tools=[TOOL], tool_choice={"type": "tool", "name": "nope"}))
    assert err.value.param == "tool_choice" and "not in tools" in err.value.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
        ({"mcp_servers": [{"name": "x"}]}, "mcp_servers"),
        ({"container": "c1"}, "container"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"speed": "fast"}, "speed"),
    ],
)
def test_unhonoured_fields_are_400s_naming_them(fields, param):
    err = rejected(**fields)
    assert err.status == 400 and err.param == param


def test_ignored_fields_are_accepted():
    check_supported(
        create(
            metadata={"user_id": "u1"},
            cache_control={"type": "ephemeral"},
            thinking={"type": "disabled"},
            service_tier="auto",
        )
    )


def test_tool_blocks_in_the_wrong_role_are_400s():
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert rejected(messages=[{"role": "user", "content": [use]}]).param == "messages[0].content[0]"


def test_count_tokens_request_renders_like_create():
    fields = {"model": "default", "messages": USER, "system": "s", "tools": [TOOL]}
    assert chat_prompt(CountTokensRequest.model_validate(fields)) == chat_prompt(create(**fields))


def test_an_echoed_sdk_tool_use_block_with_a_direct_caller_is_accepted():
    use = {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}, "caller": {"type": "direct"}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": "4C"}
    turns = [USER[0], {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    request = create(tools=[TOOL], messages=turns)
    check_supported(request)
    assert chat_prompt(request).messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_server_tool_caller_is_refused():
    use = {
        "type": "tool_use",
        "id": "t",
        "name": "f",
        "input": {},
        "caller": {"type": "code_execution_20250825"},
    }
    with pytest.raises(ValueError, match="only 'direct'"):
        create(messages=[USER[0], {"role": "assistant", "content": [use]}])
