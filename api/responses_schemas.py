"""OpenAI Responses request bodies for POST /v1/responses, as strict pydantic models.

Owns the wire names and types of every request field. Unknown nested fields are rejected
(extra="forbid"), unknown top-level fields go to api/body.py's UnknownFields. Each field's description
says its treatment: honoured, mapped, a documented no-op (it cannot change this server's output), or
refused by api/responses_convert.py / api/responses_tools.py where ignoring it would change what the
client relies on. Input items without a `type` are messages, as OpenAI reads them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class _Strict(BaseModel):
    # strict: a JSON "1" is not an int, nor 1 a bool; OpenAI and Anthropic refuse such types too.
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class InputText(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = Field(
        None, description="Accepted and ignored: annotations of earlier output add no text."
    )
    logprobs: list[dict[str, Any]] | None = Field(None, description="Accepted and ignored, as annotations.")


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Strict):
    """An image for a vision-language model: `image_url` is a data: or http(s): URL (api/images.py)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = Field(None, description="Refused: this server has no Files API; send image_url.")
    detail: str | None = Field(None, description="Only 'auto': the model's processor sets the detail.")


class UnsupportedPart(BaseModel):
    """A content part this server cannot read; rejected by name."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_file", "input_audio"]


ContentPart = Annotated[InputText | Refusal | InputImage | UnsupportedPart, Field(discriminator="type")]


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = Field(None, description="Accepted: output items may be sent back as input.")
    status: str | None = Field(None, description="Accepted, as `id`.")


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    namespace: str | None = Field(
        None, description="A namespace tool's call: the model's turn names it '<namespace>__<name>'."
    )
    arguments: str = Field(..., description="The call's arguments as a JSON object, in a string.")
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None


class SummaryText(_Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Strict):
    """Reasoning of an earlier turn, sent back as OpenAI's clients do: it goes into the next assistant
    turn's `reasoning_content` (chat templates that know reasoning render it, others drop it)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = Field(None, description="Refused unless null: this server encrypts none.")
    status: str | None = None


def _item_type(item: Any) -> str:
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(
        None, description="Accepted: forced calls follow the schema by grammar, free ones are not checked."
    )
    defer_loading: bool | None = Field(
        None, description="Accepted: there is no tool search here, so every tool is offered up front."
    )
    output_schema: dict[str, Any] | None = Field(
        None, description="Accepted and ignored: it describes the outputs the client sends back."
    )


class OtherTool(BaseModel):
    """Any other tool type: hosted tools are dropped (api/responses_tools.py), the rest refused by name."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_type(tool: Any) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)
    return kind if kind in ("function", "namespace") else "other"


MemberTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[OtherTool, Tag("other")],
    Discriminator(_tool_type),
]


class NamespaceTool(_Strict):
    """Function tools grouped under a shared name (Codex sends its MCP tools so): the model sees each as
    '<namespace>__<name>', and its calls come back with `name` and `namespace` as declared."""

    type: Literal["namespace"]
    name: str = Field(..., min_length=1)
    description: str | None = Field(None, description="Added to each member's description.")
    tools: list[MemberTool] = Field(..., min_length=1)


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[OtherTool, Tag("other")],
    Discriminator(_tool_type),
]


class TextConfig(_Strict):
    format: dict[str, Any] | None = Field(
        None, description="{'type': 'text' | 'json_object' | 'json_schema', 'schema': ...}; JSON is enforced."
    )
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="Accepted as a hint and ignored: the model's answers are as long as it makes them."
    )


class ReasoningConfig(_Strict):
    """With a reasoning parser configured the model's thinking comes back as reasoning items, raw, in
    `content`; without one there are none."""

    effort: str | None = Field(
        None,
        description="The chat template's `reasoning_effort` variable, as chat completions' field: "
        "templates that read it (gpt-oss style) honour it, the others change nothing.",
    )
    summary: str | None = Field(
        None, description="Accepted and ignored: no summarizer; `summary` stays empty."
    )
    generate_summary: str | None = Field(None, description="The deprecated spelling of `summary`.")


class ResponsesRequest(_Strict):
    # Unknown top-level fields reach api/body.py's UnknownFields, which accepts or refuses them.
    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[InputItem]
    instructions: str | None = Field(None, description="A system turn first; not carried to follow-ups.")
    previous_response_id: str | None = None
    store: bool | None = Field(None, description="Default true: keep the turn for previous_response_id.")
    stream: bool | None = None
    stream_options: dict[str, Any] | None = Field(
        None, description="Accepted and ignored: no obfuscation padding is ever sent."
    )
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = Field(
        None,
        description="'auto', 'none', 'required', {'type': 'function', 'name': ...} or {'type': "
        "'allowed_tools', 'mode': ..., 'tools': [...]}; a forcing choice is enforced by grammar.",
    )
    parallel_tool_calls: bool | None = Field(None, description="False: at most one call is read or forced.")
    max_tool_calls: int | None = Field(
        None, ge=0, description="Accepted: it limits built-in tool calls, and this server has none."
    )
    metadata: dict[str, str] | None = Field(None, description="Echoed in the response.")
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = Field(
        None,
        description="'auto' is accepted: a prompt that fits is served as with 'disabled'; one that does "
        "not is still a 400 (no input items are dropped).",
    )
    include: list[str] | None = Field(
        None,
        description="'message.output_text.logprobs' is honoured; the other values OpenAI defines are "
        "no-ops (this server makes no such data); an unknown value is a 400.",
    )
    background: bool | None = Field(None, description="Refused if true.")
    service_tier: str | None = Field(
        None, description="Accepted, any value: there is one tier, reported as 'default'."
    )
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="Alternatives per token in the output text's logprobs."
    )
    prompt: dict[str, Any] | None = Field(None, description="Refused: no stored prompt templates.")
    conversation: str | dict[str, Any] | None = Field(None, description="Refused: no conversations API.")
    context_management: list[dict[str, Any]] | None = Field(None, description="Refused unless empty.")
    prompt_cache_key: str | None = Field(None, description="Accepted and ignored: caching is automatic.")
    prompt_cache_retention: str | None = Field(None, description="Accepted and ignored, as above.")
    safety_identifier: str | None = Field(None, description="Accepted and ignored (no accounting).")
    user: str | None = Field(None, description="Accepted and ignored (no accounting).")
    client_metadata: dict[str, str] | None = Field(
        None, description="Accepted and ignored: Codex's session ids, for its own telemetry."
    )
