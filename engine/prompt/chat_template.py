"""What a model's chat template can render, and the plain-text fallback for what it cannot.

Owns one rule: a template never drops part of a request silently. A template that never mentions
`tool_calls` would render an assistant's tool calls as an empty turn, so tool calls and tool results are
flattened to text first; a template that never mentions `tools` cannot show tool definitions at all, so
they are described in the system turn in the Hermes format (`<tool_call>` JSON), which the `auto`
tool-call parser then reads. Pure functions on chat-template message dicts; no MLX, no Ray.
"""

from __future__ import annotations

import json
from typing import Any

Message = dict[str, Any]


def template_source(tokenizer: Any) -> str:
    """The template's Jinja source; several named templates are searched together."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template or ""


def renders_tools(source: str) -> bool:
    return "tools" in source


def renders_tool_calls(source: str) -> bool:
    return "tool_calls" in source


def needs_flattening(messages: list[Message]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def flatten_tool_turns(messages: list[Message]) -> list[Message]:
    """Tool calls become text of their assistant turn and tool results become user turns; adjacent
    turns of one role are then merged, since such templates usually expect roles to alternate."""
    merged: list[Message] = []
    for message in map(_flatten, messages):
        if merged and merged[-1]["role"] == message["role"] and message["role"] != "system":
            merged[-1] = {**merged[-1], "content": f"{merged[-1]['content']}\n\n{message['content']}"}
        else:
            merged.append(message)
    return merged


def _flatten(message: Message) -> Message:
    if message.get("role") == "tool":
        return {
            "role": "user",
            "content": f"Tool result {message.get('tool_call_id', '')}: {message['content']}",
        }
    calls = message.get("tool_calls")
    if not calls:
        return message
    texts = [message.get("content") or ""] + [_call_text(call) for call in calls]
    rest = {key: value for key, value in message.items() if key != "tool_calls"}
    return {**rest, "content": "\n".join(text for text in texts if text)}


def _call_text(call: Message) -> str:
    function = call["function"]
    payload = {"name": function["name"], "arguments": function["arguments"]}
    return f"Tool call {call.get('id', '')}: {json.dumps(payload, ensure_ascii=False)}"


_TOOLS_PROMPT = (
    "You may call one or more functions to assist with the user query. The functions are:\n<tools>\n{tools}\n"
    "</tools>\n\nTo call a function, answer with a JSON object with the function name and arguments "
    'inside <tool_call></tool_call> tags:\n<tool_call>\n{{"name": <function-name>, "arguments": '
    "<args-json-object>}}\n</tool_call>"
)


def add_tools_prompt(messages: list[Message], tools: list[Message]) -> list[Message]:
    """Tool definitions as text in the system turn (a new one first if there is none)."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    prompt = _TOOLS_PROMPT.format(tools=listing)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{prompt}".lstrip()}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
