"""Hermes / Qwen 2.5 / Qwen 3 tool calls: a JSON object per call in `<tool_call>` tags.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Finished calls are parsed by mlx-lm's `json_tools` parser. No MLX, no Ray.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mlx_lm.tool_parsers import json_tools

from api.tool_parsers.base import (
    MalformedCall,
    PartialCall,
    ToolSpec,
    alternatives,
    arguments_schema,
    dumps,
    json_rule,
    lark_string,
    object_arguments,
    repeat,
    scan_json_value,
    starts_like,
)

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS_KEY = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class HermesFormat:
    name = "hermes"
    start = json_tools.tool_call_start
    end: str | None = json_tools.tool_call_end
    at_start_only = False
    special_tags = False

    def read(self, region: str, final: bool) -> list[PartialCall]:
        body = region.removeprefix(self.start)
        if final:
            return [self._parse(body)]
        return [partial] if (partial := read_named_object(body)) else []

    def _parse(self, body: str) -> PartialCall:
        try:
            call = json_tools.parse_tool_call(body)
        except json.JSONDecodeError as exc:
            raise MalformedCall(f"a tool call is not valid JSON: {exc}") from None
        return named_call(call, body, ("arguments", "parameters"))

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), "{")

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {repeat('call', parallel, lark_string(chr(10)))}",
            f"call: {lark_string(self.start + chr(10))} body {lark_string(chr(10) + (self.end or ''))}",
            f"body: {alternatives(names)}",
        ]
        lines += [f"{rule}: {json_rule(named_object_schema(tool))}" for rule, tool in zip(names, tools)]
        return "\n".join(lines)


def read_named_object(text: str) -> PartialCall | None:
    """`{"name": ..., "arguments": {...}` read as far as it goes; None until the name is known.
    The arguments are the model's own text, so streamed prefixes agree with the final value."""
    head = _NAME.match(text)
    if head is None:
        return None
    name = json.loads(f'"{head.group(1)}"')
    key = _ARGUMENTS_KEY.match(text, head.end())
    rest = text[key.end() :] if key else ""
    if not rest.startswith("{"):
        return PartialCall(name)
    end, complete = scan_json_value(rest)
    return PartialCall(name, rest[:end], complete)


def named_call(call: Any, text: str, argument_keys: tuple[str, str]) -> PartialCall:
    """A decoded `{"name": ..., <arguments>}` object, whose JSON source is `text`, as a finished call;
    the first of `argument_keys` present holds the arguments (formats differ in which they prefer)."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise MalformedCall("a tool call has no name")
    first, second = argument_keys
    arguments = object_arguments(call.get(first, call.get(second, {})))
    return PartialCall(call["name"], same_json(read_named_object(text), arguments), True)


def same_json(partial: PartialCall | None, arguments: dict[str, Any]) -> str:
    """The model's own argument text when it is exactly `arguments`, else a fresh dump."""
    if partial is not None and partial.complete:
        try:
            if json.loads(partial.arguments) == arguments:
                return partial.arguments
        except json.JSONDecodeError:
            pass
    return dumps(arguments)


def named_object_schema(tool: ToolSpec, arguments_key: str = "arguments") -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool["name"]}, arguments_key: arguments_schema(tool)},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }
