"""OpenAI Responses requests -> the neutral inputs: chat-template turns, a `ChatPrompt`, `SamplingParams`.

Owns which Responses fields are honoured: anything parsed but not honoured is a 400 naming the field,
never dropped. Function calls and their outputs in `input` become chat-template tool calls and tool
turns; reasoning items become the next assistant turn's `reasoning_content`; `input_image` parts
become image parts that keep their URL, so a stored conversation replays its images. The reverse
direction lives in api/responses_outputs.py. No Ray, no MLX.
"""

from __future__ import annotations

import json
from typing import Any

from engine.messages import SamplingParams

from api import openai_tools
from api.errors import ApiError, invalid, unsupported
from api.responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputImage,
    InputText,
    MessageItem,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
    UnsupportedPart,
)
from api.responses_tools import tool_choice
from api.structured_formats import responses_text_format
from api.template_messages import (
    ChatPrompt,
    Message,
    Tool,
    image_part,
    parts_turn,
    text_part,
    text_turn,
    tool_call,
    tool_result,
)

_NOT_YET = "not supported yet"

# --- checks: fields we parse but do not honour -------------------------------------------------


def check_supported(req: ResponsesRequest) -> None:
    _check_tools(req)
    _check_refused_fields(req)
    if req.text is not None:
        responses_text_format(req.text.format)
        if req.text.verbosity is not None:
            raise unsupported("text.verbosity", "not implemented by this server")
    if req.reasoning and any(value is not None for value in req.reasoning.values()):
        raise unsupported("reasoning", "this server runs no reasoning models")
    if req.truncation == "auto":
        raise unsupported("truncation", "only 'disabled' is served: a prompt over the context is a 400")
    if req.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier", "this server has a single tier; use 'auto' or 'default'")
    if req.top_logprobs:
        raise unsupported("top_logprobs", "logprobs are not implemented for /v1/responses")
    if isinstance(req.input, list):
        _check_items(req.input)


def _check_refused_fields(req: ResponsesRequest) -> None:
    refused = {
        "include": (bool(req.include), "no extra output data is produced"),
        "background": (bool(req.background), "background responses are not implemented"),
        "prompt": (req.prompt is not None, "stored prompt templates are not implemented"),
        "conversation": (req.conversation is not None, "use previous_response_id instead"),
        "context_management": (bool(req.context_management), "context compaction is not implemented"),
    }
    for param, (is_set, detail) in refused.items():
        if is_set:
            raise unsupported(param, detail)


def _check_tools(req: ResponsesRequest) -> None:
    for i, tool in enumerate(req.tools or []):
        if not isinstance(tool, FunctionTool):
            raise unsupported(f"tools[{i}]", f"tool type {tool.type!r} is {_NOT_YET}; only 'function' tools")


def _check_items(items: list[Any]) -> None:
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem) and item.encrypted_content is not None:
            raise unsupported(f"input[{i}].encrypted_content", "this server encrypts no reasoning")
        if isinstance(item, MessageItem) and not isinstance(item.content, str):
            for j, part in enumerate(item.content):
                where = f"input[{i}].content[{j}]"
                if isinstance(part, UnsupportedPart):
                    raise unsupported(where, f"{part.type!r} parts are not supported by this server")
                if isinstance(part, InputImage):
                    _check_image(where, part, item.role)


def _check_image(where: str, part: InputImage, role: str) -> None:
    if role != "user":
        raise invalid(where, f"{where}: 'input_image' parts belong in user messages")
    if part.file_id is not None:
        raise unsupported(f"{where}.file_id", "this server has no Files API; send image_url as a data: URL")
    if not part.image_url:
        raise invalid(f"{where}.image_url", f"{where}: an input_image part needs image_url, a URL string")
    if part.detail not in (None, "auto"):
        raise unsupported(f"{where}.detail", "the model's processor sets the detail; send 'auto'")


# --- prompt ------------------------------------------------------------------------------------


def input_turns(req: ResponsesRequest) -> list[Message]:
    """This request's input as turns (instructions excluded: they are not carried to follow-ups)."""
    if isinstance(req.input, str):
        return [text_turn("user", req.input)]
    turns: list[Message] = []
    for i, item in enumerate(req.input):
        if isinstance(item, MessageItem):
            _add_message(turns, item)
        elif isinstance(item, FunctionCallItem):
            _add_call(turns, item, f"input[{i}].arguments")
        elif isinstance(item, ReasoningItem):
            turns.append({**text_turn("assistant", ""), "reasoning_content": _reasoning_text(item)})
        else:
            turns.append(tool_result(item.call_id, _output_text(item)))
    return turns


def _add_message(turns: list[Message], item: MessageItem) -> None:
    """An assistant message right after its reasoning fills the turn the reasoning opened."""
    turn = _message_turn(item)
    last = turns[-1] if turns else None
    if turn["role"] == "assistant" and last is not None and _is_reasoning_only(last):
        last["content"] = turn["content"]
    else:
        turns.append(turn)


def _is_reasoning_only(turn: Message) -> bool:
    return turn["role"] == "assistant" and "reasoning_content" in turn and not turn["content"]


def _reasoning_text(item: ReasoningItem) -> str:
    parts = item.content if item.content else item.summary
    return "\n".join(part.text for part in parts)


def _message_turn(item: MessageItem) -> Message:
    role = "system" if item.role == "developer" else item.role
    if isinstance(item.content, str):
        return text_turn(role, item.content)
    return parts_turn(role, [_part(part) for part in item.content])


def _part(part: InputText | Refusal | InputImage | UnsupportedPart) -> dict[str, Any]:
    assert not isinstance(part, UnsupportedPart), "rejected by check_supported"
    if isinstance(part, InputImage):
        return {**image_part(), _IMAGE_URL: part.image_url}
    return text_part(part.text if isinstance(part, InputText) else part.refusal)


_IMAGE_URL = "image_url"  # kept in a turn's image part: a conversation replayed from the store needs it


def _split_images(turns: list[Message]) -> tuple[list[Message], tuple[str, ...]]:
    """Turns as the template renders them (bare image parts), and their images' URLs in order."""
    urls: list[str] = []
    rendered = []
    for turn in turns:
        if isinstance(turn.get("content"), list):
            urls += [part[_IMAGE_URL] for part in turn["content"] if part["type"] == "image"]
            turn = {**turn, "content": [image_part() if p["type"] == "image" else p for p in turn["content"]]}
        rendered.append(turn)
    return rendered, tuple(urls)


def _add_call(turns: list[Message], item: FunctionCallItem, param: str) -> None:
    """Consecutive function calls after an assistant turn are that turn's tool calls."""
    call = tool_call(item.call_id, item.name, _arguments(item.arguments, param))
    if turns and turns[-1]["role"] == "assistant":
        turns[-1].setdefault("tool_calls", []).append(call)
    else:
        turns.append({**text_turn("assistant", ""), "tool_calls": [call]})


def _arguments(arguments: str, param: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise invalid(param, f"'{param}' is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise invalid(param, f"'{param}' must be a JSON object")
    return value


def _output_text(item: FunctionCallOutputItem) -> str:
    return item.output if isinstance(item.output, str) else "\n".join(p.text for p in item.output)


def chat_prompt(req: ResponsesRequest, conversation: list[Message]) -> ChatPrompt:
    """`conversation`: the stored turns of previous_response_id, then this request's input turns."""
    system = [text_turn("system", req.instructions)] if req.instructions else []
    messages, image_urls = _split_images(system + conversation)
    return ChatPrompt(messages, template_tools(req), image_urls=image_urls)


def template_tools(req: ResponsesRequest) -> list[Tool] | None:
    """Tool definitions for the template: the offered (allowed) ones; none with tool_choice 'none'."""
    return openai_tools.template_tools(tool_choice(req))


def previous_not_found(response_id: str) -> ApiError:
    message = f"Previous response with id '{response_id}' not found."
    return ApiError(400, message, param="previous_response_id", code="previous_response_not_found")


# --- sampling ----------------------------------------------------------------------------------


def sampling_params(req: ResponsesRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=req.max_output_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        structured=responses_text_format(req.text.format) if req.text is not None else None,
    )
