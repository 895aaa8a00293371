"""What Claude Code 2.1.x sends to /v1/messages: each field honoured, mapped, a no-op, or a 400 naming it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.anthropic_convert import chat_prompt, check_supported, fold_system_turns, sampling_params
from api.anthropic_outputs import MessageMeta, message
from api.anthropic_schemas import CountTokensRequest, MessagesRequest
from api.choice_state import ChoiceState
from api.errors import ApiError
from api.output_parser import OutputParsing
from api.template_messages import ChatPrompt

USER = {"role": "user", "content": "hi"}
ANSWER = {"role": "assistant", "content": "hello"}
TOOL = {"name": "Read", "description": "Reads a file", "input_schema": {"type": "object"}}
CACHE = {"type": "ephemeral", "ttl": "1h"}


def create(**fields) -> MessagesRequest:
    body = {"model": "default", "max_tokens": 8, "messages": [USER], **fields}
    request = MessagesRequest.model_validate(body)
    check_supported(request)
    return request


def rejected(**fields) -> ApiError:
    with pytest.raises(ApiError) as err:
        create(**fields)
    assert err.value.status == 400
    return err.value


def turns(**fields) -> list[dict]:
    return chat_prompt(create(**fields)).messages


def thinking_turn(thought: str, text: str = "ok") -> dict:
    return {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thought, "signature": ""},
            {"type": "text", "text": text},
        ],
    }


# --- system messages -----------------------------------------------------------------------------


def test_a_system_message_mid_conversation_is_a_system_turn_in_place():
    reminder = {"role": "system", "content": [{"type": "text", "text": "Be terse.", "cache_control": CACHE}]}
    messages = [USER, ANSWER, reminder, {"role": "user", "content": "more"}]
    assert turns(system="S", messages=messages) == [
        {"role": "system", "content": "S"},
        USER,
        ANSWER,
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "more"},
    ]


def test_leading_system_messages_join_the_system_prompt():
    messages = [{"role": "system", "content": "A"}, {"role": "system", "content": "B"}, USER]
    assert turns(system="S", messages=messages) == [{"role": "system", "content": "S\n\nA\n\nB"}, USER]
    assert turns(messages=messages)[0] == {"role": "system", "content": "A\n\nB"}


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "tool_use", "id": "t", "name": "Read", "input": {}},
    ],
)
def test_a_system_message_takes_text_only(block):
    messages = [USER, {"role": "system", "content": [block]}]
    assert rejected(messages=messages).param == "messages[1].content[0]"


def test_folding_moves_later_system_turns_into_the_system_prompt_in_order():
    prompt = ChatPrompt(
        [
            {"role": "system", "content": "S"},
            USER,
            {"role": "system", "content": "one"},
            {"role": "user", "content": "more"},
            ANSWER,
            {"role": "system", "content": "two"},
        ],
        template_kwargs={"enable_thinking": True},
    )
    folded = fold_system_turns(prompt)
    assert folded is not None and folded.template_kwargs == {"enable_thinking": True}
    # The user turns the system turn split are one again: such templates want roles to alternate.
    assert folded.messages == [
        {"role": "system", "content": "S\n\none\n\ntwo"},
        {"role": "user", "content": "hi\n\nmore"},
        ANSWER,
    ]


def test_folding_adds_a_system_turn_when_there_is_none_and_needs_a_later_one():
    prompt = ChatPrompt([USER, {"role": "system", "content": "one"}])
    assert fold_system_turns(prompt) == ChatPrompt([{"role": "system", "content": "one"}, USER])
    assert fold_system_turns(ChatPrompt([{"role": "system", "content": "S"}, USER])) is None


# --- thinking ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thinking", "kwargs"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, {"enable_thinking": True}),
        ({"type": "adaptive"}, {"enable_thinking": True}),
        ({"type": "adaptive", "display": "omitted"}, {"enable_thinking": True}),
        ({"type": "disabled"}, {"enable_thinking": False}),
        (None, {}),
    ],
)
def test_thinking_reaches_the_template_as_enable_thinking(thinking, kwargs):
    assert chat_prompt(create(thinking=thinking)).template_kwargs == kwargs


@pytest.mark.parametrize(
    "thinking", [{"type": "enabled"}, {"type": "enabled", "budget_tokens": 0}, {"type": "sometimes"}]
)
def test_a_malformed_thinking_config_is_refused(thinking):
    with pytest.raises(ValidationError):
        create(thinking=thinking)


def test_budget_tokens_caps_nothing_but_max_tokens_does():
    params = sampling_params(create(max_tokens=64, thinking={"type": "enabled", "budget_tokens": 1024}))
    assert params.max_tokens == 64


def test_thinking_in_history_is_the_turns_reasoning_and_redacted_thinking_is_dropped():
    redacted = {
        "role": "assistant",
        "content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "b"}],
    }
    messages = [USER, thinking_turn("Think A."), {"role": "user", "content": "again"}, redacted, USER]
    out = turns(messages=messages)
    assert out[1] == {"role": "assistant", "content": "ok", "reasoning_content": "Think A."}
    assert out[3] == {"role": "assistant", "content": "b"}


def test_thinking_blocks_belong_in_assistant_messages():
    block = {"type": "thinking", "thinking": "t", "signature": "s"}
    assert rejected(messages=[{"role": "user", "content": [block]}]).param == "messages[0].content[0]"


def test_with_a_reasoning_parser_the_reply_has_a_thinking_block_and_without_one_only_text():
    state = ChoiceState(0, text="<think>Count.</think>Three.", finish_reason="stop")
    meta = MessageMeta.new("m")
    parsed = message(meta, state, OutputParsing(reasoning_parser="qwen3")).content
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in parsed] == [
        ("thinking", "Count."),
        ("text", "Three."),
    ]
    plain = message(meta, state, OutputParsing()).content
    assert [b.type for b in plain] == ["text"]


# --- output_config -------------------------------------------------------------------------------


@pytest.mark.parametrize("effort", ["low", "medium", "high", "xhigh", "max"])
def test_effort_is_accepted_and_changes_nothing(effort):
    plain = create()
    request = create(output_config={"effort": effort})
    assert chat_prompt(request) == chat_prompt(plain) and sampling_params(request) == sampling_params(plain)


def test_output_config_format_still_constrains_decoding_beside_effort():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    config = {"effort": "high", "format": {"type": "json_schema", "schema": schema}}
    structured = sampling_params(create(output_config=config)).structured
    assert structured is not None and structured.json_schema == schema


@pytest.mark.parametrize("config", [{"effort": "extreme"}, {"verbosity": "low"}])
def test_unknown_output_config_values_are_refused(config):
    with pytest.raises(ValidationError):
        create(output_config=config)


# --- context_management --------------------------------------------------------------------------


def history() -> list[dict]:
    ask = {"role": "user", "content": "next"}
    return [USER, thinking_turn("one"), ask, thinking_turn("two"), ask, thinking_turn("three"), ask]


@pytest.mark.parametrize(
    ("edit", "kept"),
    [
        ({"type": "clear_thinking_20251015"}, ["three"]),
        (
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
            ["two", "three"],
        ),
        ({"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}, []),
        ({"type": "clear_thinking_20251015", "keep": "all"}, ["one", "two", "three"]),
        ({"type": "clear_thinking_20251015", "keep": {"type": "all"}}, ["one", "two", "three"]),
        ({"type": "clear_thinking_20260101"}, ["three"]),
    ],
)
def test_clear_thinking_keeps_the_reasoning_of_the_latest_turns(edit, kept):
    out = turns(messages=history(), context_management={"edits": [edit]})
    assert [t["reasoning_content"] for t in out if "reasoning_content" in t] == kept
    assert [t["content"] for t in out if t["role"] == "assistant"] == ["ok", "ok", "ok"]


def test_clear_thinking_without_thinking_changes_nothing():
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    assert turns(messages=[USER, ANSWER, USER], context_management=edits) == [USER, ANSWER, USER]
    assert turns(context_management={"edits": []}) == [USER]


@pytest.mark.parametrize("kind", ["clear_tool_uses_20250919", "compact_20260112"])
def test_any_other_context_edit_is_a_400_naming_it(kind):
    edits = {"edits": [{"type": "clear_thinking_20251015"}, {"type": kind, "trigger": {}}]}
    err = rejected(context_management=edits)
    assert err.param == "context_management.edits[1].type" and kind in err.message


# --- accepted no-ops -----------------------------------------------------------------------------


def every_block_with_cache_control() -> list[dict]:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    return [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CACHE}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "sig", "cache_control": CACHE},
                {"type": "redacted_thinking", "data": "x", "cache_control": CACHE},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {}, "cache_control": CACHE},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "x", "cache_control": CACHE},
                {"type": "image", "source": image, "cache_control": CACHE},
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "s", "cache_control": CACHE}]},
    ]


def test_cache_control_is_accepted_on_every_block_and_changes_no_prompt():
    def without_cache(value):
        if isinstance(value, dict):
            return {k: without_cache(v) for k, v in value.items() if k != "cache_control"}
        return [without_cache(v) for v in value] if isinstance(value, list) else value

    fields = {
        "messages": every_block_with_cache_control(),
        "system": [{"type": "text", "text": "S", "cache_control": CACHE}],
        "tools": [{**TOOL, "cache_control": CACHE}],
        "cache_control": CACHE,
    }
    assert chat_prompt(create(**fields)) == chat_prompt(create(**without_cache(fields)))


def test_metadata_service_tier_and_tool_fields_are_accepted():
    tool = {**TOOL, "strict": True, "defer_loading": True, "eager_input_streaming": True}
    request = create(
        metadata={"user_id": "user_abc_account_x_session_y"},
        service_tier="auto",
        tools=[{**tool, "allowed_callers": ["direct"]}],
    )
    assert chat_prompt(request).tools == chat_prompt(create(tools=[TOOL])).tools


def test_input_examples_are_shown_after_the_description():
    tool = {**TOOL, "input_examples": [{"file_path": "/a"}]}
    description = chat_prompt(create(tools=[tool])).tools[0]["function"]["description"]
    assert description == 'Reads a file\n\nInput examples:\n{"file_path": "/a"}'


def test_a_tool_only_code_execution_may_call_is_refused():
    tool = {**TOOL, "allowed_callers": ["code_execution_20250825"]}
    assert rejected(tools=[tool]).param == "tools[0].allowed_callers"


def test_an_image_in_a_tool_result_is_a_400_naming_it():
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "a"}, image]}
    messages = [USER, use, {"role": "user", "content": [result]}]
    assert rejected(messages=messages).param == "messages[2].content[0].content[1]"


def test_count_tokens_takes_the_same_fields_and_renders_alike():
    fields = {
        "model": "default",
        "messages": [USER, ANSWER, {"role": "system", "content": "r"}, USER],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
    }
    counted = CountTokensRequest.model_validate(fields)
    check_supported(counted)
    assert chat_prompt(counted) == chat_prompt(create(**fields))
