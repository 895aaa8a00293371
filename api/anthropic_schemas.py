"""Anthropic Messages request bodies for /v1/messages and /v1/messages/count_tokens, as strict pydantic
models.

Owns the wire names and types of every request field. Unknown nested fields are rejected
(extra="forbid"), unknown top-level fields go to api/body.py's UnknownFields; fields that parse but are
not honoured are rejected by api/anthropic_convert.py, so nothing is dropped silently. Fields described
as "accepted and ignored" (no-ops) change nothing a client could observe here: each description says why.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

_IGNORED_CACHE = "Accepted and ignored: prefix caching is automatic and shared."
_DIRECT_CALLER = (
    "Who made the call. SDKs echo {'type': 'direct'} (the model itself) back with the block; it says "
    "nothing the prompt needs. Server-tool callers are refused."
)


class _Strict(BaseModel):
    # strict: a JSON "1" is not an int, nor 1 a bool; OpenAI and Anthropic refuse such types too.
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)
    citations: list[dict[str, Any]] | None = Field(
        None, description="Accepted and ignored: citations annotate earlier output, they add no text."
    )


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)
    caller: dict[str, Any] | None = Field(None, description=_DIRECT_CALLER)

    @field_validator("caller")
    @classmethod
    def _direct_caller_only(cls, caller: dict[str, Any] | None) -> dict[str, Any] | None:
        if caller is not None and caller.get("type") != "direct":
            raise ValueError(
                f"caller type {caller.get('type')!r} is a server tool's; only 'direct' is served"
            )
        return caller


class ImageSource(_Strict):
    type: Literal["base64", "url"]
    media_type: str | None = Field(
        None, description="For base64: image/jpeg, image/png, image/gif or image/webp."
    )
    data: str | None = Field(None, description="For base64: the image, base64-encoded.")
    url: str | None = Field(None, description="For url: an https: URL the server fetches.")


class ImageBlock(_Strict):
    """An image in a user turn; served by a vision-language model only (checked by the route)."""

    type: Literal["image"]
    source: ImageSource
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)


class ThinkingBlock(_Strict):
    """Reasoning of an earlier assistant turn: it becomes that turn's `reasoning_content` (templates that
    know reasoning render it, others drop it)."""

    type: Literal["thinking"]
    thinking: str
    signature: str = Field("", description="Accepted and ignored: this server signs and checks nothing.")
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)


class RedactedThinkingBlock(_Strict):
    """Another server's encrypted reasoning: nothing here can read it, so it is dropped from the prompt."""

    type: Literal["redacted_thinking"]
    data: str
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)


class UnsupportedBlock(BaseModel):
    """A block type Anthropic defines that this text-only server cannot read; rejected by name."""

    model_config = ConfigDict(extra="allow")
    type: Literal[
        "document",
        "search_result",
        "tool_reference",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    ]


ResultBlock = Annotated[TextBlock | ImageBlock | UnsupportedBlock, Field(discriminator="type")]


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultBlock] = Field("", description="Text only; other blocks are refused by name.")
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | UnsupportedBlock,
    Field(discriminator="type"),
]


class Message(_Strict):
    """`system` messages are Claude Code's mid-conversation instructions (text only): rendered in place
    where the chat template allows it, else folded into the system prompt (see
    deployments/anthropic_routes.py)."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolDefinition(_Strict):
    """A client tool; Anthropic's server tools (a `type` other than 'custom') are refused by name."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)
    strict: bool | None = Field(
        None, description="Accepted: forced calls follow the schema by grammar, free ones are not checked."
    )
    eager_input_streaming: bool | None = Field(
        None, description="Accepted: tool input always streams as it is parsed (input_json_delta)."
    )
    defer_loading: bool | None = Field(
        None, description="Accepted: with no tool search here, deferred tools are shown up front."
    )
    input_examples: list[dict[str, Any]] | None = Field(
        None, description="Shown to the model after the tool's description."
    )
    allowed_callers: list[str] | None = Field(
        None, description="Must include 'direct': this server runs no code-execution callers."
    )


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = Field(
        None, description="Honoured where the call is forced (any, tool): the grammar allows one call."
    )


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(
        ..., ge=1, description="Accepted, not enforced: nothing caps reasoning apart from max_tokens."
    )
    display: Literal["summarized", "omitted"] | None = Field(
        None, description="Accepted and ignored: reasoning is returned whole."
    )


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = Field(
        None, description="Accepted and ignored: reasoning is returned whole."
    )


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None,
        description="Accepted and ignored: no local model reads an effort level; `thinking` does reach it.",
    )
    format: dict[str, Any] | None = Field(
        None, description="{'type': 'json_schema', 'schema': ...}, enforced while decoding."
    )


class ThinkingTurns(_Strict):
    type: Literal["thinking_turns"]
    value: int = Field(..., ge=0)


class AllThinkingTurns(_Strict):
    type: Literal["all"]


class ClearThinkingEdit(_Strict):
    """Drops the reasoning of all but the last `keep` assistant turns that have some (default 1)."""

    type: str
    keep: ThinkingTurns | AllThinkingTurns | Literal["all"] | None = None


class OtherEdit(BaseModel):
    """Any other context edit (clear_tool_uses_*, compact_*): parsed to be refused by name."""

    model_config = ConfigDict(extra="allow")
    type: str


def _edit_kind(edit: Any) -> str:
    kind = edit.get("type") if isinstance(edit, dict) else getattr(edit, "type", None)
    return "clear_thinking" if isinstance(kind, str) and kind.startswith("clear_thinking_") else "other"


ContextEdit = Annotated[
    Annotated[ClearThinkingEdit, Tag("clear_thinking")] | Annotated[OtherEdit, Tag("other")],
    Discriminator(_edit_kind),
]


class ContextManagement(_Strict):
    edits: list[ContextEdit] = Field(default_factory=list)


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    user_id: str | None = None


class _PromptFields(_Strict):
    """Everything that shapes the prompt: shared by create and count_tokens, so both count alike."""

    model: str
    messages: list[Message] = Field(..., min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = Field(
        None,
        description="Passed to the chat template as `enable_thinking` (false only for 'disabled'), which "
        "Qwen3-style templates read. With a reasoning parser configured, what the model reasons comes back "
        "as thinking blocks; without one the output is all text.",
    )
    output_config: OutputConfig | None = None
    output_format: dict[str, Any] | None = Field(
        None, description="The structured-outputs beta's spelling of output_config.format."
    )
    context_management: ContextManagement | None = Field(
        None, description="Only clear_thinking_* edits; any other edit is refused by name."
    )
    mcp_servers: list[dict[str, Any]] | None = Field(None, description="Refused unless empty.")
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)
    speed: Literal["standard", "fast"] | None = Field(None, description="Only 'standard' is served.")
    user_profile_id: str | None = Field(None, description="Accepted and ignored (no accounting).")
    workspace_id: str | None = Field(None, description="Accepted and ignored (no accounting).")


class MessagesRequest(_PromptFields):
    # Unknown top-level fields reach api/body.py's UnknownFields, which accepts or refuses them.
    model_config = ConfigDict(extra="allow")
    max_tokens: int = Field(..., ge=1)
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0, description="Default 1.0, as Anthropic's.")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="0 or null: off.")
    metadata: Metadata | None = Field(None, description="Accepted and ignored (no per-user accounting).")
    service_tier: Literal["auto", "standard_only"] | None = Field(
        None, description="Accepted: this server has a single, standard tier."
    )
    inference_geo: str | None = Field(None, description="Accepted and ignored: inference runs here.")
    container: dict[str, Any] | str | None = Field(None, description="Refused unless null.")
    diagnostics: dict[str, Any] | None = Field(None, description="Refused unless null.")


class CountTokensRequest(_PromptFields):
    # Unknown top-level fields reach api/body.py's UnknownFields, which accepts or refuses them.
    model_config = ConfigDict(extra="allow")
