"""LFM2 tool calls: a Python list of keyword-argument calls between special tokens.

    <|tool_call_start|>[get_weather(city="Paris", unit="celsius"), get_time()]<|tool_call_end|>

Read with `ast`, literals only (JSON's true/false/null too, as templates render nested values as JSON);
anything else is not a call. Arguments stream one finished keyword at a time. No MLX, no Ray.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from typing import Any

from api.tool_parsers.base import (
    MalformedCall,
    PartialCall,
    ToolSpec,
    alternatives,
    arguments_schema,
    dumps,
    json_rule,
    lark_string,
    repeat,
)

_NAME = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
_BEGINS = re.compile(r"\s*(\[\s*[A-Za-z_]?[\w.]*)?")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class Lfm2Format:
    name = "lfm2"
    start = "<|tool_call_start|>"
    end: str | None = "<|tool_call_end|>"
    at_start_only = False
    special_tags = True

    def read(self, region: str, final: bool) -> list[PartialCall]:
        body = region.removeprefix(self.start).strip()
        if final:
            return _parse_list(body)
        if not body.startswith("["):
            return []
        rest, calls = body[1:], list[PartialCall]()
        while head := _NAME.match(rest):
            commas, close = _scan_arguments(rest, head.end())
            if close is None:
                bounds = [head.end(), *(i + 1 for i in commas)]
                keywords = [rest[a : b - 1] for a, b in itertools.pairwise(bounds)]
                return [*calls, PartialCall(head.group(1), dumps(_read_keywords(keywords))[:-1])]
            call = _read_call(rest[head.start(1) : close + 1])
            if call is None:
                return calls
            calls.append(call)
            rest = rest[close + 1 :].lstrip().removeprefix(",")
        return calls

    def begins_call(self, region: str) -> bool:
        return _BEGINS.fullmatch(region.removeprefix(self.start)) is not None

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        head, tail = lark_string(self.start + "["), lark_string("]" + (self.end or ""))
        lines = [
            f"start: {head} {repeat('call', parallel, lark_string(', '))} {tail}",
            f"call: {alternatives(names)}",
        ]
        for rule, tool in zip(names, tools):
            schema = arguments_schema(tool)
            properties = schema.get("properties") or {}
            required = [key for key in schema.get("required") or [] if key in properties]
            values = [f"{rule}_{j}" for j in range(len(required))]
            keywords = f" {lark_string(', ')} ".join(
                f"{lark_string(key + '=')} {value}" for key, value in zip(required, values)
            )
            lines.append(f"{rule}: {lark_string(tool['name'] + '(')} {keywords} {lark_string(')')}")
            lines += [f"{value}: {json_rule(properties[key])}" for key, value in zip(required, values)]
        return "\n".join(lines)


def _scan_arguments(text: str, start: int) -> tuple[list[int], int | None]:
    """The top-level commas of the argument list opening at `start`, and its closing `)` (None: not
    written yet)."""
    depth, quote, escaped, commas = 0, "", False, list[int]()
    for i in range(start, len(text)):
        char = text[i]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return commas, i
            depth -= 1
        elif char == "," and depth == 0:
            commas.append(i)
    return commas, None


def _read_keywords(keywords: list[str]) -> dict[str, Any]:
    """The finished `key=value` arguments of a call still being written, up to the first that does not
    read."""
    arguments: dict[str, Any] = {}
    for keyword in filter(str.strip, keywords):
        call = _read_call(f"f({keyword})")
        if call is None:
            break
        arguments.update(json.loads(call.arguments))
    return arguments


def _parse_list(body: str) -> list[PartialCall]:
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as exc:
        raise MalformedCall(f"lfm2 tool calls are not a Python list: {exc}") from None
    if not isinstance(tree, ast.List) or not tree.elts:
        raise MalformedCall("lfm2 tool calls are not a non-empty list")
    return [_call(node) for node in tree.elts]


def _read_call(text: str) -> PartialCall | None:
    try:
        return _call(ast.parse(text, mode="eval").body)
    except (SyntaxError, MalformedCall):
        return None


def _call(node: ast.expr) -> PartialCall:
    if not isinstance(node, ast.Call) or node.args:
        raise MalformedCall("an lfm2 tool call must be name(key=value, ...)")
    name = _dotted_name(node.func)
    if name is None:
        raise MalformedCall("an lfm2 tool call's function is not a name")
    try:
        return PartialCall(name, dumps(_literal_arguments(node)), True)
    except (TypeError, ValueError) as exc:  # a set, bytes or complex value is no JSON
        raise MalformedCall(f"lfm2 tool-call arguments are not JSON values: {exc}") from None


def _literal_arguments(node: ast.Call) -> dict[str, Any]:
    if any(keyword.arg is None for keyword in node.keywords):
        raise MalformedCall("an lfm2 tool call cannot unpack **arguments")
    try:
        return {
            keyword.arg or "": ast.literal_eval(_JsonNames().visit(keyword.value))
            for keyword in node.keywords
        }
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise MalformedCall(f"lfm2 tool-call arguments are not literals: {exc}") from None


def _dotted_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        parent = _dotted_name(func.value)
        return f"{parent}.{func.attr}" if parent else None
    return None


class _JsonNames(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id not in _JSON_NAMES:
            return node
        return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
