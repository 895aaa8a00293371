"""A request's tools and tool choice, dialect-neutral: which calls are parsed, and which are forced.

Owns the rule that a forcing tool choice (OpenAI `required` or a named function, Anthropic `any` or
`tool`) is enforced by constrained decoding: the request's `SamplingParams.structured` gets a grammar
in the tool-call format's own syntax, so whatever the model samples parses as a call to an allowed
tool with schema-valid arguments. A named choice forces exactly one call, as OpenAI's "forced
function" and vLLM's named tool_choice do: a grammar that let a small model go on would have it repeat
the same call. No MLX, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from engine.messages import SamplingParams, StructuredOutputs

from api.errors import invalid, unsupported
from api.output_parser import OutputParsing
from api.tool_parsers import ToolSpec, make_format

Mode = Literal["auto", "none", "required"]


@dataclass(frozen=True)
class ToolChoice:
    """`named`: the one tool a named choice forces (mode is then `required`)."""

    tools: list[ToolSpec] = field(default_factory=list)
    mode: Mode = "auto"
    named: str | None = None
    parallel: bool = True

    def callable_tools(self) -> list[ToolSpec]:
        return [tool for tool in self.tools if self.named is None or tool["name"] == self.named]

    @property
    def forced_parallel(self) -> bool:
        """Whether a forcing grammar lets one output hold several calls."""
        return self.parallel and self.named is None


def tool_spec(name: str, description: str | None, parameters: dict[str, Any] | None) -> ToolSpec:
    return {"name": name, "description": description, "parameters": parameters or {"type": "object"}}


def check_named(choice: ToolChoice, param: str) -> None:
    names = [tool["name"] for tool in choice.tools]
    if choice.mode != "auto" and choice.mode != "none" and not choice.tools:
        raise invalid(param, f"'{param}' forces a tool call, but the request has no tools")
    if choice.named is not None and choice.named not in names:
        raise invalid(param, f"'{param}' names tool {choice.named!r}, which is not in tools: {names}")


def output_parsing(
    choice: ToolChoice, tool_parser: str | None, reasoning_parser: str | None
) -> OutputParsing:
    """How to read this request's output; `tool_parser` None (tool calling off) refuses tools."""
    if not choice.tools or choice.mode == "none":
        return OutputParsing(reasoning_parser=reasoning_parser)
    if tool_parser is None:
        raise unsupported("tools", "tool calling is off on this server (no tool_call_parser configured)")
    names = frozenset(tool["name"] for tool in choice.callable_tools())
    return OutputParsing(make_format(tool_parser, choice.tools), names, reasoning_parser)


def apply(choice: ToolChoice, parsing: OutputParsing, params: SamplingParams, param: str) -> None:
    """Forces the call by grammar when the choice demands one; keeps the markup's special tokens."""
    if parsing.keeps_special_tokens:
        params.skip_special_tokens = False
    fmt = parsing.tool_format
    if fmt is None:
        return
    if choice.mode != "required":
        return
    if params.structured is not None:
        raise unsupported(param, "a forced tool call cannot be combined with a structured output format")
    params.structured = StructuredOutputs(
        grammar=fmt.grammar(choice.callable_tools(), choice.forced_parallel), param="tools"
    )
