"""Templates that cannot render tool calls get them as text, so no part of a request is dropped."""

from __future__ import annotations

from engine.prompt.chat_template import (
    flatten_tool_turns,
    needs_flattening,
    renders_tool_calls,
    renders_tools,
)

SMOL = "{% for message in messages %}{{ message['role'] + message['content'] }}{% endfor %}"
TOOLS = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.tool_calls }}{% endfor %}"
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}


def test_what_a_template_renders():
    assert not renders_tools(SMOL) and not renders_tool_calls(SMOL)
    assert renders_tools(TOOLS) and renders_tool_calls(TOOLS)


def test_tool_turns_are_flattened_to_text_and_merged():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me see.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": "thanks"},
    ]
    assert needs_flattening(messages)
    flat = flatten_tool_turns(messages)
    assert flat[:2] == messages[:2]
    assert flat[2] == {
        "role": "assistant",
        "content": 'Let me see.\nTool call c1: {"name": "f", "arguments": {"x": 1}}',
    }
    assert flat[3] == {"role": "user", "content": "Tool result c1: 42\n\nthanks"}
    assert not needs_flattening(flat)
