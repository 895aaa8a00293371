"""OpenAI Responses requests -> the neutral inputs: chat-template turns, a `ChatPrompt`, `SamplingParams`.

Owns which Responses fields are honoured, which are documented no-ops (api/responses_schemas.py says
which) and which are a 400 naming the field: one whose loss would change what the client relies on.
Function calls and their outputs in `input` become chat-template tool calls and tool turns (a
namespaced call under its flattened name, api/responses_tools.py); reasoning items become the next
assistant turn's `reasoning_content`; `input_image` parts become image parts that keep their URL, so a
stored conversation replays its images. The reverse direction lives in api/responses_outputs.py.
No Ray, no MLX.
"""

from __future__ import annotations

import json
from typing import Any

from engine.messages import SamplingParams

from api import openai_tools
from api.errors import ApiError, invalid, unsupported
from api.output_parser import OutputParsing
from api.responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    InputText,
    MessageItem,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
    UnsupportedPart,
)
from api.responses_tools import check_tools, flat_name, tool_choice
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

LOGPROBS = "message.output_text.logprobs"
# The include values OpenAI defines besides LOGPROBS: each asks for data this server never makes
# (hosted tool results, encrypted reasoning, echoed input image URLs), so each is a no-op.
NO_OP_INCLUDES = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "message.input_image.image_url",
    }
)

# --- checks: fields we parse but do not honour -------------------------------------------------


def check_supported(req: ResponsesRequest) -> None:
    check_tools(req)
    _check_refused_fields(req)
    _check_include(req.include or [])
    if req.text is not None:
        responses_text_format(req.text.format)
    if isinstance(req.input, list):
        _check_items(req.input)


def _check_refused_fields(req: ResponsesRequest) -> None:
    refused = {
        "background": (bool(req.background), "background responses are not implemented"),
        "prompt": (req.prompt is not None, "stored prompt templates are not implemented"),
        "conversation": (req.conversation is not None, "use previous_response_id instead"),
        "context_management": (bool(req.context_management), "context compaction is not implemented"),
    }
    for param, (is_set, detail) in refused.items():
        if is_set:
            raise unsupported(param, detail)


def _check_include(values: list[str]) -> None:
    """Known values are honoured or no-ops; an unknown one may ask for data the client then misses."""
    for i, value in enumerate(values):
        if value != LOGPROBS and value not in NO_OP_INCLUDES:
            known = ", ".join(sorted({LOGPROBS, *NO_OP_INCLUDES}))
            raise invalid(f"include[{i}]", f"include value {value!r} is unknown; known values: {known}")


def wants_logprobs(req: ResponsesRequest) -> bool:
    return LOGPROBS in (req.include or []) or bool(req.top_logprobs)


def check_logprobs(req: ResponsesRequest, parsing: OutputParsing) -> None:
    """Logprobs go with the one output_text of plain output; parsed output has no per-item split yet."""
    if wants_logprobs(req) and parsing.active:
        param = "include" if LOGPROBS in (req.include or []) else "top_logprobs"
        detail = "logprobs are not supported yet with tools or with a reasoning parser on this server"
        raise unsupported(param, detail)


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
    name = flat_name(item.namespace, item.name)
    call = tool_call(item.call_id, name, _arguments(item.arguments, param))
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
    return ChatPrompt(
        messages, template_tools(req), image_urls=image_urls, template_kwargs=template_kwargs(req)
    )


def template_kwargs(req: ResponsesRequest) -> dict[str, Any]:
    """`reasoning.effort` as the variable gpt-oss-style templates read, as chat completions passes it."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    return {} if effort is None else {"reasoning_effort": effort}


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
        logprobs=(req.top_logprobs or 0) if wants_logprobs(req) else None,
    )
