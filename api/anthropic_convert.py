"""Anthropic Messages requests -> the neutral inputs: a `ChatPrompt` for the Tokenizer and `SamplingParams`.

Owns which Anthropic fields are honoured: anything parsed but not honoured is a 400 naming the field,
never dropped. Tool use and tool results become chat-template tool calls and tool turns. The reverse
direction lives in api/anthropic_outputs.py. No Ray, no MLX.
"""

from __future__ import annotations

from typing import Any, Literal

from engine.messages import SamplingParams

from api.anthropic_schemas import (
    ImageBlock,
    ImageSource,
    Message,
    MessagesRequest,
    TextBlock,
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

# --- checks: fields we parse but do not honour -------------------------------------------------


def check_supported(req: _PromptFields) -> None:
    _check_tools(req)
    if req.thinking is not None and req.thinking.get("type") != "disabled":
        raise unsupported(
            "thinking", "extended thinking is not implemented; omit it or send {'type': 'disabled'}"
        )
    anthropic_output_format(req.output_config, req.output_format)
    if req.context_management is not None:
        raise unsupported("context_management", "context editing is not implemented")
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


def _check_message(i: int, message: Message) -> None:
    if isinstance(message.content, str):
        return
    for j, block in enumerate(message.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, UnsupportedBlock):
            raise unsupported(where, f"{block.type!r} blocks are not supported by this text-only server")
        if isinstance(block, ImageBlock):
            _check_image(where, block, message.role)
        if isinstance(block, ToolUseBlock) and message.role != "assistant":
            raise invalid(where, f"{where}: 'tool_use' blocks belong in assistant messages")
        if isinstance(block, ToolResultBlock) and message.role != "user":
            raise invalid(where, f"{where}: 'tool_result' blocks belong in user messages")


# --- prompt ------------------------------------------------------------------------------------


def chat_prompt(req: _PromptFields) -> ChatPrompt:
    """The system turn, then each message's turns; a final assistant message is a prefill to continue."""
    turns = [] if not (system := system_text(req.system)) else [text_turn("system", system)]
    for message in req.messages:
        turns.extend(message_turns(message))
    prefill = req.messages[-1].role == "assistant"
    if prefill and turns[-1].get("tool_calls"):
        raise invalid(
            "messages", "the last message has tool_use blocks; send their tool_result in a user turn"
        )
    return ChatPrompt(turns, template_tools(req), continue_final_message=prefill, image_urls=image_urls(req))


def system_text(system: str | list[TextBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "\n".join(block.text for block in system)


def message_turns(message: Message) -> list[Turn]:
    """One Anthropic message -> chat-template turns: a user message's tool results become `tool` turns
    (in block order), an assistant message's tool uses become the tool calls of its one turn."""
    if isinstance(message.content, str):
        return [text_turn(message.role, message.content)]
    if message.role == "assistant":
        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
        calls = [tool_call(b.id, b.name, b.input) for b in message.content if isinstance(b, ToolUseBlock)]
        return [assistant_turn("\n".join(texts), calls)]
    return _user_turns(message.content)


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
    text = block.content if isinstance(block.content, str) else "\n".join(b.text for b in block.content)
    return f"Error: {text}" if block.is_error else text


def template_tools(req: _PromptFields) -> list[Tool] | None:
    """Tool definitions for the template; none with tool_choice 'none', so the model cannot call one."""
    if not req.tools or (req.tool_choice is not None and req.tool_choice.type == "none"):
        return None
    return [function_tool(t.name, t.description, t.input_schema) for t in req.tools]


def tool_choice(req: _PromptFields) -> ToolChoice:
    """`any` and `tool` force a call (by grammar, see api/tool_choice.py); `tool` names the one tool."""
    choice = req.tool_choice
    specs = [tool_spec(t.name, t.description, t.input_schema) for t in req.tools or []]
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
        structured=anthropic_output_format(req.output_config, req.output_format),
    )
