"""OpenAI request bodies for /v1/chat/completions and /v1/completions, as strict pydantic models.

Owns the wire names and types of every request parameter. Unknown nested fields are rejected
(extra="forbid"), unknown top-level fields go to api/body.py's UnknownFields; fields that parse but are
not honoured are rejected by api/openai_convert.py, so nothing is dropped silently. Nullable fields
default to None and get their OpenAI defaults in the converter.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    # strict: a JSON "1" is not an int, nor 1 a bool; OpenAI and Anthropic refuse such types too.
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = Field(
        None, description="Accepted and ignored: this server never pads chunks with obfuscation fields."
    )


class ContentPart(_Strict):
    """One part of a message's content; only `text` parts are honoured (checked in the converter)."""

    type: str
    text: str | None = None
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    refusal: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = Field(None, description="Passed to the chat template, which may ignore it.")
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    audio: dict[str, Any] | None = None


class _SamplingFields(_Strict):
    """Parameters shared by chat and text completions, plus the vLLM-style extensions."""

    model: str
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100]."
    )
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(
        None, ge=1, description="Choices per prompt, at most 16; they share the prompt's KV."
    )
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = Field(None, description="Accepted and ignored (no per-user accounting).")
    # Extensions beyond OpenAI, as vLLM names them.
    top_k: int | None = Field(None, ge=-1, description="-1, 0 or null: off.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    guided_json: dict[str, Any] | str | None = Field(None, description="vLLM's: a JSON schema to follow.")
    guided_regex: str | None = Field(None, description="vLLM's: a regular expression the output matches.")
    guided_choice: list[str] | None = Field(None, description="vLLM's: the output is one of these strings.")
    response_format: dict[str, Any] | None = Field(
        None, description="{'type': 'text' | 'json_object' | 'json_schema'}; JSON is enforced while decoding."
    )


class ChatCompletionRequest(_SamplingFields):
    # Unknown top-level fields reach api/body.py's UnknownFields, which accepts or refuses them.
    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(None, description="Accepted; meaningless without tools.")
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = Field(
        None, description="Accepted and ignored: predicted outputs only speed up a hosted model."
    )
    reasoning_effort: str | None = Field(
        None,
        description="Passed to the chat template as `reasoning_effort`; templates that lack it ignore it.",
    )
    verbosity: str | None = Field(None, description="Accepted and ignored: a hint no local model reads.")
    web_search_options: dict[str, Any] | None = Field(
        None, description="Accepted and ignored: this server runs no web search (a hosted tool)."
    )
    service_tier: str | None = Field(None, description="Accepted; the response reports 'default'.")
    store: bool | None = Field(None, description="Accepted and ignored: nothing is stored for evals.")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored (nothing is stored).")
    prompt_cache_key: str | None = Field(
        None, description="Accepted and ignored: prefix caching is automatic and shared."
    )
    safety_identifier: str | None = Field(None, description="Accepted and ignored, like `user`.")
    # Extensions, as vLLM names them: render the template without the assistant header; extra template
    # variables (e.g. {"enable_thinking": false} for Qwen3).
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Variables passed to the chat template, e.g. {'enable_thinking': false}."
    )


class CompletionRequest(_SamplingFields):
    # Unknown top-level fields reach api/body.py's UnknownFields, which accepts or refuses them.
    model_config = ConfigDict(extra="allow")
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1)
    echo: bool | None = None
    suffix: str | None = None


class EmbeddingRequest(_Strict):
    # Unknown top-level fields reach api/body.py's UnknownFields, which accepts or refuses them.
    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, description="Accepted and ignored (no per-user accounting).")
