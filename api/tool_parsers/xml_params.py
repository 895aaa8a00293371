"""Arguments written one tagged element per parameter, raw values typed by the tool's schema (GLM-4.5,
MiniMax-M2): reading a value back and the grammar rules that write one. No MLX, no Ray.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from api.tool_parsers.base import ToolSpec, alternatives, arguments_schema, json_rule, lark_string

Properties = dict[str, dict[str, Any]]


def properties_by_tool(tools: list[ToolSpec] | None) -> dict[str, Properties]:
    return {tool["name"]: arguments_schema(tool).get("properties") or {} for tool in tools or []}


def typed_value(raw: str, prop: dict[str, Any] | None) -> Any:
    """A string-typed parameter keeps its text; any other is JSON when it parses as JSON, else text."""
    text = raw.strip()
    if prop is not None and _is_string(prop):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _is_string(prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    return kind == "string" or (
        isinstance(kind, list) and "string" in kind and set(kind) <= {"string", "null"}
    )


def lark_regex(text: str) -> str:
    """The body of a Lark regex literal matching `text` (no regex metacharacters in it)."""
    return text.replace("/", "\\/").replace("\n", "\\n")


def parameter_rules(
    rule: str, tool: ToolSpec, element: Callable[[str], tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """The parameters of `rule`'s call: its required parameters in schema order, each `element(key)`'s
    opening tag, the value, its closing tag. A free string's value is the rule `string_value`, which
    the caller defines to end with the closing tag; other values are JSON (or one of their enum)."""
    schema = arguments_schema(tool)
    properties = schema.get("properties") or {}
    required = [key for key in schema.get("required") or [] if key in properties]
    parts, lines = [], []
    for j, key in enumerate(required):
        value, (open_tag, close_tag) = f"{rule}_{j}", element(key)
        raw = properties[key].get("type") == "string" and "enum" not in properties[key]
        parts.append(f"{lark_string(open_tag)} {value}" + ("" if raw else f" {lark_string(close_tag)}"))
        lines.append(f"{value}: {'string_value' if raw else _value_rule(properties[key])}")
    return parts, lines


def _value_rule(prop: dict[str, Any]) -> str:
    if prop.get("type") == "string":
        return alternatives([lark_string(str(v)) for v in prop["enum"]])
    return json_rule(prop)
