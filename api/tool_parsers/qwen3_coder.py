"""Qwen3-Coder tool calls: XML with one `<parameter=...>` element per argument, in `<tool_call>` tags.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parsed by mlx-lm's `qwen3_coder` parser, which types each value from the tool's schema. Arguments stream
one finished parameter at a time. No MLX, no Ray.
"""

from __future__ import annotations

import re
from typing import Any

from mlx_lm.tool_parsers import qwen3_coder

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
    starts_like,
)

_FUNCTION = re.compile(r"\s*<function=([^\s<>]+)>")
_PARAMETER_END = "</parameter>"
_FUNCTION_END = "</function>"


class Qwen3CoderFormat:
    name = "qwen3_coder"
    start = qwen3_coder.tool_call_start
    end: str | None = qwen3_coder.tool_call_end
    at_start_only = False
    special_tags = False

    def __init__(self, tools: list[ToolSpec] | None = None):
        self._tools = [{"type": "function", "function": tool} for tool in tools or []]

    def read(self, region: str, final: bool) -> list[PartialCall]:
        body = region.removeprefix(self.start)
        head = _FUNCTION.match(body)
        if head is None:
            if final:
                raise MalformedCall("a qwen3_coder tool call has no <function=...>")
            return []
        if final:
            return [PartialCall(head.group(1), dumps(self._parse(body.rstrip())), True)]
        done = body.rfind(_PARAMETER_END)
        if done < 0:
            return [PartialCall(head.group(1), "{")]
        so_far = self._parse(body[: done + len(_PARAMETER_END)] + "\n" + _FUNCTION_END)
        return [PartialCall(head.group(1), dumps(so_far)[:-1])]

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), "<function=")

    def _parse(self, body: str) -> dict[str, Any]:
        try:
            call = qwen3_coder.parse_tool_call(body, self._tools)
        except ValueError as exc:
            raise MalformedCall(f"a qwen3_coder tool call does not parse: {exc}") from None
        return object_arguments(call["arguments"])

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {repeat('call', parallel, lark_string(chr(10)))}",
            f"call: {lark_string(self.start + chr(10))} body {lark_string(self.end or '')}",
            f"body: {alternatives(names)}",
            "string_value[lazy]: /(?s:.+)\\n<\\/parameter>\\n/",
        ]
        for rule, tool in zip(names, tools):
            lines += _function_rules(rule, tool)
        return "\n".join(lines)


def _function_rules(rule: str, tool: ToolSpec) -> list[str]:
    """The function element: required parameters in schema order, each value as the parser reads it
    back (strings raw, everything else JSON)."""
    schema = arguments_schema(tool)
    properties = schema.get("properties") or {}
    required = [key for key in schema.get("required") or [] if key in properties]
    parts, lines = [], []
    for j, key in enumerate(required):
        value = f"{rule}_{j}"
        open_tag, close_tag = lark_string(f"<parameter={key}>\n"), lark_string(f"\n{_PARAMETER_END}\n")
        raw = _is_raw_string(properties[key])  # a string's rule ends with its own closing tag
        parts.append(f"{open_tag} {value}" + ("" if raw else f" {close_tag}"))
        lines.append(f"{value}: {'string_value' if raw else _value_rule(properties[key])}")
    head, tail = lark_string(f"<function={tool['name']}>\n"), lark_string(_FUNCTION_END + "\n")
    return [f"{rule}: {head} {' '.join(parts)} {tail}", *lines]


def _is_raw_string(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "string" and "enum" not in prop


def _value_rule(prop: dict[str, Any]) -> str:
    if prop.get("type") == "string":
        return alternatives([lark_string(str(v)) for v in prop["enum"]])
    return json_rule(prop)
