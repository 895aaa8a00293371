"""Chat-template messages: Hugging Face's messages format, the one neutral chat input every dialect
converts to and the Tokenizer deployment renders with the model's template.

Owns the dict shapes of turns, assistant tool calls, tool results and tool definitions, so no dialect
borrows another's wire format. No Ray, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
Tool = dict[str, Any]


def text_turn(role: str, content: str) -> Message:
    return {"role": role, "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part() -> dict[str, Any]:
    """Where an image sits in a turn's content parts; the images' URLs travel beside the messages, in
    order (`ChatPrompt.image_urls`), and the model's processor expands each part into image tokens."""
    return {"type": "image"}


def parts_turn(role: str, parts: list[dict[str, Any]]) -> Message:
    """A turn with images: its content is the parts; a text-only turn keeps a plain string content."""
    if any(part["type"] == "image" for part in parts):
        return {"role": role, "content": parts}
    return text_turn(role, "\n".join(part["text"] for part in parts))


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments as a dict: templates render them with `tojson` (a JSON string would be quoted twice)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_turn(content: str, tool_calls: list[dict[str, Any]]) -> Message:
    turn = text_turn("assistant", content)
    if tool_calls:
        turn["tool_calls"] = tool_calls
    return turn


def tool_result(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> Tool:
    function: dict[str, Any] = {
        "name": name,
        "parameters": parameters or {"type": "object", "properties": {}},
    }
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


@dataclass(frozen=True)
class ChatPrompt:
    """What the Tokenizer's `chat_prompt_ids` renders: turns, tool definitions, and whether to open a
    new assistant turn or continue the last one (an assistant prefill)."""

    messages: list[Message]
    tools: list[Tool] | None = None
    continue_final_message: bool = False
    image_urls: tuple[str, ...] = ()  # one per image part, in prompt order: data:, http(s): or file: URLs
    opens_turn: bool | None = None  # None: open an assistant turn unless continuing the last one
    # Extra variables for the template (chat_template_kwargs, reasoning_effort): templates read the ones
    # they know, e.g. Qwen3's `enable_thinking`; the rest change nothing.
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def add_generation_prompt(self) -> bool:
        return not self.continue_final_message if self.opens_turn is None else self.opens_turn
