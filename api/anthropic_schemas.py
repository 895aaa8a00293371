"""Anthropic Messages request bodies for /v1/messages and /v1/messages/count_tokens, as strict pydantic models.

Owns the wire names and types of every request field. Unknown fields are rejected (extra="forbid");
fields that parse but are not honoured are rejected by api/anthropic_convert.py, so nothing is dropped
silently. Fields described as "accepted and ignored" change nothing a client could observe here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)


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


class UnsupportedBlock(BaseModel):
    """A block type Anthropic defines that this text-only server cannot read; rejected by name."""

    model_config = ConfigDict(extra="allow")
    type: Literal[
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    ]


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | UnsupportedBlock, Field(discriminator="type")
]


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ToolDefinition(_Strict):
    """A client tool; Anthropic's server tools (a `type` other than 'custom') are refused by name."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)
    strict: bool | None = Field(None, description="Accepted: this server produces no tool calls yet.")
    eager_input_streaming: bool | None = Field(
        None, description="Accepted: this server streams no tool input yet."
    )


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = Field(
        None, description="Accepted: this server produces no tool calls yet."
    )


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
    thinking: dict[str, Any] | None = Field(None, description="Only {'type': 'disabled'} is served.")
    output_config: dict[str, Any] | None = Field(
        None, description="Only `format`: {'type': 'json_schema', 'schema': ...}, enforced while decoding."
    )
    output_format: dict[str, Any] | None = Field(
        None, description="The structured-outputs beta's spelling of output_config.format."
    )
    context_management: dict[str, Any] | None = Field(None, description="Refused unless null.")
    mcp_servers: list[dict[str, Any]] | None = Field(None, description="Refused unless empty.")
    cache_control: dict[str, Any] | None = Field(None, description=_IGNORED_CACHE)
    speed: Literal["standard", "fast"] | None = Field(None, description="Only 'standard' is served.")
    user_profile_id: str | None = Field(None, description="Accepted and ignored (no accounting).")
    workspace_id: str | None = Field(None, description="Accepted and ignored (no accounting).")


class MessagesRequest(_PromptFields):
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
    pass
