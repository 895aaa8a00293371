"""OpenAI response bodies: chat.completion(.chunk), text_completion, model list and usage.

Owns the response wire shapes only; api/openai_convert.py fills them from engine outputs.
Serialize with `dump()`: a field whose default is None is omitted unless it was set (set to None it
is sent as null, as OpenAI sends `"usage": null` on chunks only when usage was asked for).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class _Response(BaseModel):
    def model_post_init(self, context: Any) -> None:
        always = {name for name, field in type(self).model_fields.items() if field.default is not None}
        self.model_fields_set.update(always)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class PromptTokensDetails(_Response):
    cached_tokens: int = 0


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatChoiceLogprobs(_Response):
    content: list[ChatLogprob]


class ChatMessageOut(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None  # set only when the model called tools
    reasoning: str | None = None  # set only with a reasoning parser; also sent as reasoning_content
    reasoning_content: str | None = None


class ChatChoice(_Response):
    index: int
    message: ChatMessageOut
    logprobs: ChatChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # set (maybe to null) only when stream_options.include_usage


class CompletionLogprobs(_Response):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(_Response):
    """Both the whole text_completion and each streamed chunk (OpenAI uses one object type)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlx-ray-serve"
    root: str  # what it was loaded from: a directory, hub id or bundled name (vLLM's `root`)
    max_model_len: int | None  # None: an on-demand model that never ran and has no configured length
    # What the model takes and gives (OpenRouter's architecture fields): "text", "image"; "embedding".
    input_modalities: list[str] = ["text"]
    output_modalities: list[str] = ["text"]
    # "loaded", "loading", "cold" (on demand, no replica) or "failed" (it cannot start)
    state: str | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Embedding(_Response):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(_Response):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Response):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
