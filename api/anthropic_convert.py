"""Anthropic Messages requests -> the neutral inputs: a `ChatPrompt` for the Tokenizer and `SamplingParams`.

Owns which Anthropic fields are honoured: a field is honoured, mapped, or a no-op that cannot change the
output here (documented on the schema); anything else parsed is a 400 naming the field, never dropped.
Tool use and tool results become chat-template tool calls and tool turns, thinking blocks the turn's
`reasoning_content`, system messages system turns. The reverse direction lives in
api/anthropic_outputs.py. No Ray, no MLX.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal

from engine.messages import SamplingParams, StructuredOutputs

from api.anthropic_schemas import (
    ClearThinkingEdit,
    ImageBlock,
    ImageSource,
    Message,
    MessagesRequest,
    OtherEdit,
    TextBlock,
    ThinkingBlock,
    ThinkingTurns,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    UnsupportedBlock,
    _PromptFields,
)
from api.errors import invalid, unsupported
from api.structured_formats import anthropic_output_format
from api.template_messages import (
    ChatPrompt,
    Tool,
    assistant_turn,
    function_tool,
    image_part,
    parts_turn,
    text_part,
    text_turn,
    tool_call,
    tool_result,
)
from api.template_messages import Message as Turn
from api.tool_choice import ToolChoice, check_named, tool_spec

DEFAULT_TEMPERATURE = 1.0  # Anthropic's default, unlike OpenAI's sampling-off-by-default
_NOT_YET = "not supported yet"
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # what Anthropic accepts
_ASSISTANT_BLOCKS = ("tool_use", "thinking", "redacted_thinking")

# --- checks: fields we parse but do not honour, and misplaced blocks --------------------------


def check_supported(req: _PromptFields) -> None:
    _check_tools(req)
    output_format(req)
    _check_context_edits(req)
    if req.mcp_servers:
        raise unsupported("mcp_servers", "this server connects to no MCP servers")
    if req.speed == "fast":
        raise unsupported("speed", "only 'standard' is served")
    for i, message in enumerate(req.messages):
        _check_message(i, message)
    if isinstance(req, MessagesRequest):
        _check_create(req)


def _check_create(req: MessagesRequest) -> None:
    if req.container is not None:
        raise unsupported("container", "this server runs no code-execution containers")
    if req.diagnostics is not None:
        raise unsupported("diagnostics", "prompt-cache diagnostics are not implemented")
    if any(not stop for stop in req.stop_sequences or []):
        raise invalid("stop_sequences", "stop sequences must not be empty strings")


def _check_tools(req: _PromptFields) -> None:
    for i, tool in enumerate(req.tools or []):
        if tool.type not in (None, "custom"):
            raise unsupported(
                f"tools[{i}].type", f"server tool {tool.type!r} is {_NOT_YET}; only custom tools"
            )
        if tool.input_schema is None:
            raise invalid(f"tools[{i}].input_schema", f"tools[{i}].input_schema: Field required")
        if tool.allowed_callers is not None and "direct" not in tool.allowed_callers:
            raise unsupported(
                f"tools[{i}].allowed_callers", "this server runs no code-execution callers; include 'direct'"
            )


def _check_context_edits(req: _PromptFields) -> None:
    """clear_thinking edits are honoured (see `keep_thinking_turns`); ignoring any other edit would
    send the model a prompt the client believes was cut, so it is refused."""
    for i, edit in enumerate(req.context_management.edits if req.context_management else []):
        if isinstance(edit, OtherEdit):
            raise unsupported(
                f"context_management.edits[{i}].type",
                f"context edit {edit.type!r} is not implemented; only clear_thinking_* edits are served",
            )


def _check_message(i: int, message: Message) -> None:
    if isinstance(message.content, str):
        return
    for j, block in enumerate(message.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, UnsupportedBlock):
            raise unsupported(where, f"{block.type!r} blocks are not supported by this text-only server")
        if message.role == "system" and not isinstance(block, TextBlock):
            raise invalid(where, f"{where}: system messages take only 'text' blocks")
        if isinstance(block, ImageBlock):
            _check_image(where, block, message.role)
        if isinstance(block, ToolResultBlock):
            _check_tool_result(where, block, message.role)
        if block.type in _ASSISTANT_BLOCKS and message.role != "assistant":
            raise invalid(where, f"{where}: {block.type!r} blocks belong in assistant messages")


def _check_tool_result(where: str, block: ToolResultBlock, role: str) -> None:
    if role != "user":
        raise invalid(where, f"{where}: 'tool_result' blocks belong in user messages")
    for k, part in enumerate([] if isinstance(block.content, str) else block.content):
        if not isinstance(part, TextBlock):
            raise unsupported(f"{where}.content[{k}]", f"{part.type!r} blocks in tool results are {_NOT_YET}")


# --- prompt ------------------------------------------------------------------------------------


def chat_prompt(req: _PromptFields) -> ChatPrompt:
    """The system turn (`system` and any system messages before the first turn), then each message's
    turns in order, later system messages included; a final assistant message is a prefill to continue."""
    num_leading = next((i for i, m in enumerate(req.messages) if m.role != "system"), len(req.messages))
    leading = [message_text(m) for m in req.messages[:num_leading]]
    system = "\n\n".join(text for text in [system_text(req.system), *leading] if text)
    turns = [text_turn("system", system)] if system else []
    for message in req.messages[num_leading:]:
        turns.extend(message_turns(message))
    clear_thinking(turns, keep_thinking_turns(req))
    prefill = req.messages[-1].role == "assistant"
    if prefill and turns[-1].get("tool_calls"):
        raise invalid(
            "messages", "the last message has tool_use blocks; send their tool_result in a user turn"
        )
    return ChatPrompt(
        turns,
        template_tools(req),
        continue_final_message=prefill,
        image_urls=image_urls(req),
        template_kwargs=template_kwargs(req),
    )


def template_kwargs(req: _PromptFields) -> dict[str, Any]:
    """`thinking` as `enable_thinking`, the variable Qwen3-style templates read to open or skip their
    reasoning; other templates ignore it. Omitted, the template's own default stands."""
    return {} if req.thinking is None else {"enable_thinking": req.thinking.type != "disabled"}


def system_text(system: str | list[TextBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "\n".join(block.text for block in system)


def message_text(message: Message) -> str:
    """A system message's text (checked to hold text blocks only)."""
    if isinstance(message.content, str):
        return message.content
    return "\n".join(block.text for block in message.content if isinstance(block, TextBlock))


def message_turns(message: Message) -> list[Turn]:
    """One Anthropic message -> chat-template turns: a user message's tool results become `tool` turns
    (in block order), an assistant message's tool uses become the tool calls of its one turn and its
    thinking that turn's `reasoning_content` (redacted thinking is unreadable here and dropped)."""
    if message.role == "system" or isinstance(message.content, str):
        return [text_turn(message.role, message_text(message))]
    if message.role == "assistant":
        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
        calls = [tool_call(b.id, b.name, b.input) for b in message.content if isinstance(b, ToolUseBlock)]
        turn = assistant_turn("\n".join(texts), calls)
        if thinking := [b.thinking for b in message.content if isinstance(b, ThinkingBlock)]:
            turn["reasoning_content"] = "\n".join(thinking)
        return [turn]
    return _user_turns(message.content)


def keep_thinking_turns(req: _PromptFields) -> int | None:
    """How many of the latest assistant turns keep their reasoning: a clear_thinking edit's `keep`
    (Anthropic's default 1), None (all) without one or with keep 'all'."""
    edits = req.context_management.edits if req.context_management else []
    clearing = [edit for edit in edits if isinstance(edit, ClearThinkingEdit)]
    if not clearing:
        return None
    keep = clearing[-1].keep
    if keep is None:
        return 1
    return keep.value if isinstance(keep, ThinkingTurns) else None


def clear_thinking(turns: list[Turn], keep: int | None) -> None:
    if keep is None:
        return
    thinking = [turn for turn in turns if "reasoning_content" in turn]
    for turn in thinking[: max(len(thinking) - keep, 0)]:
        del turn["reasoning_content"]


def fold_system_turns(prompt: ChatPrompt) -> ChatPrompt | None:
    """The prompt with every system turn after the first turn folded, in order, into the leading
    system turn, and the user turns it separated joined; None when there is nothing to fold."""
    later = [turn["content"] for turn in prompt.messages[1:] if turn["role"] == "system"]
    if not later:
        return None
    first, rest = prompt.messages[0], [turn for turn in prompt.messages[1:] if turn["role"] != "system"]
    if first["role"] == "system":
        head = [text_turn("system", "\n\n".join([first["content"], *later]))]
    else:
        head = [text_turn("system", "\n\n".join(later)), first]
    return replace(prompt, messages=_join_user_turns([*head, *rest]))


def _join_user_turns(turns: list[Turn]) -> list[Turn]:
    """Adjacent plain-text user turns as one: templates that refuse a later system turn usually also
    insist that roles alternate."""
    joined: list[Turn] = []
    for turn in turns:
        last = joined[-1] if joined else None
        if last is not None and _plain_user(last) and _plain_user(turn):
            joined[-1] = text_turn("user", f"{last['content']}\n\n{turn['content']}")
        else:
            joined.append(turn)
    return joined


def _plain_user(turn: Turn) -> bool:
    return turn["role"] == "user" and isinstance(turn["content"], str)


def _user_turns(blocks: list[Any]) -> list[Turn]:
    turns: list[Turn] = []
    parts: list[dict[str, Any]] = []  # text and image parts of the user turn being built
    for block in blocks:
        if isinstance(block, (TextBlock, ImageBlock)):
            parts.append(text_part(block.text) if isinstance(block, TextBlock) else image_part())
            continue
        if parts:
            turns.append(parts_turn("user", parts))
            parts = []
        turns.append(tool_result(block.tool_use_id, tool_result_text(block)))
    if parts or not turns:
        turns.append(parts_turn("user", parts))
    return turns


def image_urls(req: _PromptFields) -> tuple[str, ...]:
    """Each image block's source as a URL (base64 as a data: URL), in prompt order."""
    blocks = [b for m in req.messages if not isinstance(m.content, str) for b in m.content]
    return tuple(_source_url(b.source) for b in blocks if isinstance(b, ImageBlock))


def _source_url(source: ImageSource) -> str:
    return f"data:{source.media_type};base64,{source.data}" if source.type == "base64" else source.url or ""


def _check_image(where: str, block: ImageBlock, role: str) -> None:
    if role != "user":
        raise invalid(where, f"{where}: 'image' blocks belong in user messages")
    source = block.source
    if source.type == "base64" and (source.media_type not in IMAGE_MEDIA_TYPES or not source.data):
        raise invalid(
            f"{where}.source",
            f"{where}.source: a base64 image needs 'data' and a media_type of {', '.join(IMAGE_MEDIA_TYPES)}",
        )
    if source.type == "url" and not source.url:
        raise invalid(f"{where}.source.url", f"{where}.source: a url image needs 'url'")


def tool_result_text(block: ToolResultBlock) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:  # text blocks only: check_supported refuses the others
        text = "\n".join(part.text for part in block.content if isinstance(part, TextBlock))
    return f"Error: {text}" if block.is_error else text


def template_tools(req: _PromptFields) -> list[Tool] | None:
    """Tool definitions for the template; none with tool_choice 'none', so the model cannot call one."""
    if not req.tools or (req.tool_choice is not None and req.tool_choice.type == "none"):
        return None
    return [function_tool(t.name, tool_description(t), t.input_schema) for t in req.tools]


def tool_description(tool: ToolDefinition) -> str | None:
    """The description, then any `input_examples` as JSON lines: the template shows no other field."""
    if not tool.input_examples:
        return tool.description
    examples = "\n".join(json.dumps(example, ensure_ascii=False) for example in tool.input_examples)
    return f"{tool.description or ''}\n\nInput examples:\n{examples}".lstrip()


def tool_choice(req: _PromptFields) -> ToolChoice:
    """`any` and `tool` force a call (by grammar, see api/tool_choice.py); `tool` names the one tool."""
    choice = req.tool_choice
    specs = [tool_spec(t.name, tool_description(t), t.input_schema) for t in req.tools or []]
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    if choice is None or choice.type == "auto":
        return ToolChoice(specs, parallel=parallel)
    if choice.type == "tool" and not choice.name:
        raise invalid("tool_choice.name", "tool_choice {'type': 'tool'} needs 'name'")
    mode: Literal["none", "required"] = "none" if choice.type == "none" else "required"
    parsed = ToolChoice(specs, mode, choice.name if choice.type == "tool" else None, parallel)
    check_named(parsed, "tool_choice")
    return parsed


# --- sampling ----------------------------------------------------------------------------------


def sampling_params(req: MessagesRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=req.max_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or None,
        stop=list(req.stop_sequences or []),
        structured=output_format(req),
    )


def output_format(req: _PromptFields) -> StructuredOutputs | None:
    """output_config.format (or the beta's output_format); output_config.effort changes nothing here."""
    fmt = req.output_config.format if req.output_config is not None else None
    return anthropic_output_format(None if fmt is None else {"format": fmt}, req.output_format)
