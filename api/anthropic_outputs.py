"""A `ChoiceState` (the engine's accumulated output) -> Anthropic's Message object and its stop fields.

Owns the response wire shapes of /v1/messages. Usage reports the whole prompt as `input_tokens`, equal
to what /v1/messages/count_tokens answers: the automatic prefix cache is not Anthropic's prompt cache,
so no `cache_*_input_tokens` are reported. No Ray, no MLX.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import from_json

from api.choice_state import ChoiceState
from api.output_parser import OutputParser, OutputParsing, parse_whole

TOOL_USE_ID_PREFIX = "toolu_"
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


@dataclass(frozen=True)
class MessageMeta:
    id: str
    model: str

    @classmethod
    def new(cls, model: str) -> MessageMeta:
        return cls(f"msg_{uuid.uuid4().hex}", model)


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # this server signs nothing; clients send thinking back as-is or not at all


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ThinkingContent | TextContent | ToolUseContent]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage

    def dump(self) -> dict[str, Any]:
        return self.model_dump()


def stop_fields(state: ChoiceState, called: bool = False) -> tuple[StopReason | None, str | None]:
    """(stop_reason, stop_sequence): the engine stops on a stop string (a `str` stop reason), on an
    end-of-turn token, or at max_tokens (finish reason 'length'); `called`: the output has tool calls."""
    if state.finish_reason is None:
        return None, None
    if state.finish_reason == "length":
        return "max_tokens", None
    if isinstance(state.stop_reason, str):
        return "stop_sequence", state.stop_reason
    return ("tool_use" if called else "end_turn"), None


def usage(state: ChoiceState) -> Usage:
    return Usage(input_tokens=state.num_prompt_tokens, output_tokens=state.num_output_tokens)


def message(meta: MessageMeta, state: ChoiceState, parsing: OutputParsing | None = None) -> MessageOut:
    """The whole message: one text block (maybe empty) unless `parsing` reads thinking and tool calls
    out of it (then thinking, text if any, tool_use blocks, in that order)."""
    if parsing is None or not parsing.active:
        content: list[Any] = [TextContent(text=state.text)]
    else:
        content = parsed_blocks(parse_whole(parsing, state.text, TOOL_USE_ID_PREFIX))
    stop_reason, stop_sequence = stop_fields(state, any(isinstance(b, ToolUseContent) for b in content))
    return MessageOut(
        id=meta.id,
        model=meta.model,
        content=content,
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=usage(state),
    )


def parsed_blocks(parser: OutputParser) -> list[ThinkingContent | TextContent | ToolUseContent]:
    blocks: list[ThinkingContent | TextContent | ToolUseContent] = []
    if parser.reasoning:
        blocks.append(ThinkingContent(thinking=parser.reasoning))
    if parser.content.strip() or not parser.calls:
        blocks.append(TextContent(text=parser.content))
    blocks += [ToolUseContent(id=c.id, name=c.name, input=tool_input(c.arguments)) for c in parser.calls]
    return blocks


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's input; one cut short by max_tokens keeps what its arguments hold so far, read as the
    Anthropic SDKs read a streamed tool_use block (jiter's partial mode)."""
    try:
        value = from_json(arguments or "{}", allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def started_message(meta: MessageMeta, num_input_tokens: int) -> MessageOut:
    """The `message_start` snapshot: no content yet, no output tokens counted."""
    empty = Usage(input_tokens=num_input_tokens, output_tokens=0)
    return MessageOut(
        id=meta.id, model=meta.model, content=[], stop_reason=None, stop_sequence=None, usage=empty
    )
