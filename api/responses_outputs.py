"""A `ChoiceState` (the engine's accumulated output) -> the Responses API's `response` object and items.

Owns the response wire shapes of /v1/responses: assistant message items with one output_text part (and
its logprobs when asked for), function_call items (with `namespace` for a namespace tool's call) and
reasoning items, the status (completed, or incomplete at max_output_tokens), usage, and the request
settings every response echoes. No Ray, no MLX.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from engine.messages import TokenLogprob

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from api.choice_state import ChoiceState
from api.openai_outputs import TokenText
from api.responses_schemas import ResponsesRequest

Status = Literal["in_progress", "completed", "incomplete", "failed"]


@dataclass(frozen=True)
class ResponseMeta:
    id: str
    item_id: str  # the one output message's id
    created_at: int
    model: str

    @classmethod
    def new(cls, model: str) -> ResponseMeta:
        return cls(f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time()), model)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallOut(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str  # a JSON object's text (cut short when the output was)
    status: Status
    namespace: str | None = None  # the namespace tool that declared `name`; left out when none did

    @model_serializer(mode="wrap")
    def _without_empty_namespace(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("namespace") is None:
            data.pop("namespace", None)
        return data


class ReasoningPart(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningOut(BaseModel):
    """The reasoning parser's text as `content`; no model summarizes it, so `summary` stays empty."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningPart]
    status: Status


OutputItem = OutputMessage | FunctionCallOut | ReasoningOut


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    settings: dict[str, Any] = Field(exclude=True)  # the request's, echoed at the top level by dump()

    def dump(self) -> dict[str, Any]:
        return {**self.model_dump(), **self.settings}


def settings(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as every response echoes them, with OpenAI's defaults filled in. Hosted
    tools are echoed in `tools` though none ran: the output holds no call of theirs."""
    text = req.text
    reasoning = req.reasoning
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tool_choice": req.tool_choice or "auto",
        "tools": [tool.model_dump() for tool in req.tools or []],
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "store": req.store is not False,
        "metadata": req.metadata or {},
        "text": {
            "format": (text.format if text and text.format else None) or {"type": "text"},
            "verbosity": (text.verbosity if text else None) or "medium",
        },
        "truncation": req.truncation or "disabled",
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None,
        },
        "service_tier": "default",  # the one tier, whatever was asked for
        "top_logprobs": req.top_logprobs or 0,
        "prompt_cache_key": req.prompt_cache_key,
        "safety_identifier": req.safety_identifier,
    }


def logprob_entries(entries: Iterable[TokenLogprob], text: TokenText) -> list[dict[str, Any]]:
    """Engine logprobs as an output_text part's `logprobs` (and its deltas'): `text` maps token ids."""
    return [
        {
            **_token_logprob(text[entry.token_id], entry.logprob),
            "top_logprobs": [_token_logprob(text[token_id], lp) for token_id, lp in entry.top],
        }
        for entry in entries
    ]


def _token_logprob(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def final_status(state: ChoiceState) -> Status:
    return "incomplete" if state.finish_reason == "length" else "completed"


def output_message(
    meta: ResponseMeta, state: ChoiceState, status: Status, logprobs: list[dict[str, Any]] | None = None
) -> OutputMessage:
    part = OutputText(text=state.text, logprobs=logprobs or [])
    return OutputMessage(id=meta.item_id, status=status, content=[part])


def usage(state: ChoiceState) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=state.num_prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=state.num_cached_tokens),
        output_tokens=state.num_output_tokens,
        total_tokens=state.num_prompt_tokens + state.num_output_tokens,
    )


def started_response(meta: ResponseMeta, echo: dict[str, Any]) -> ResponseObject:
    """The snapshot of response.created and response.in_progress: nothing generated yet."""
    return ResponseObject(
        id=meta.id,
        created_at=meta.created_at,
        status="in_progress",
        model=meta.model,
        output=[],
        settings=echo,
    )


def finished_response(
    meta: ResponseMeta,
    echo: dict[str, Any],
    state: ChoiceState,
    output: list[OutputItem] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> ResponseObject:
    """`output`: the parsed items (api/responses_items.py); by default the whole text as one message,
    with `logprobs` (`logprob_entries`) when asked for."""
    status = final_status(state)
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return ResponseObject(
        id=meta.id,
        created_at=meta.created_at,
        status=status,
        incomplete_details=incomplete,
        model=meta.model,
        output=[output_message(meta, state, status, logprobs)] if output is None else output,
        usage=usage(state),
        settings=echo,
    )


def failed_response(meta: ResponseMeta, echo: dict[str, Any], code: str, message: str) -> ResponseObject:
    response = started_response(meta, echo)
    response.status = "failed"
    response.error = {"code": code, "message": message}
    return response
