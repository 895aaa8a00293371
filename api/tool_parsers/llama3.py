"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole reply is one JSON object per call, `;`-separated,
optionally after the `<|python_tag|>` special token.

    {"name": "get_weather", "parameters": {"city": "Paris"}}

A call region opens only at the start of the output (after whitespace). No MLX, no Ray.
"""

from __future__ import annotations

import json

from api.tool_parsers.base import (
    MalformedCall,
    PartialCall,
    ToolSpec,
    alternatives,
    json_rule,
    lark_string,
    repeat,
    scan_json_value,
    starts_like,
)
from api.tool_parsers.hermes import named_call, named_object_schema, read_named_object

PYTHON_TAG = "<|python_tag|>"
_SEPARATOR = ";"


class Llama3Format:
    name = "llama3_json"
    starts = (PYTHON_TAG, "{")
    start = PYTHON_TAG
    end: str | None = None
    at_start_only = True
    special_tags = True

    def read(self, region: str, final: bool) -> list[PartialCall]:
        rest, calls = region.removeprefix(PYTHON_TAG).lstrip(), list[PartialCall]()
        while rest.startswith("{"):
            end, _ = scan_json_value(rest)
            text = rest[:end]
            call = self._parse(text) if final else read_named_object(text)
            if call is None:
                return calls
            calls.append(call)
            rest = rest[end:].lstrip().removeprefix(_SEPARATOR).lstrip()
        if final and (rest or not calls):
            raise MalformedCall(f"text after the tool calls does not parse: {rest[:40]!r}")
        return calls

    def _parse(self, text: str) -> PartialCall:
        try:
            call = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MalformedCall(f"a tool call is not valid JSON: {exc}") from None
        return named_call(call, text, ("parameters", "arguments"))

    def begins_call(self, region: str) -> bool:
        # A bare `{` opens JSON answers too: only a named object's head is a call's beginning.
        return starts_like(region.removeprefix(PYTHON_TAG), '{"name"')

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {repeat('call', parallel, lark_string('; '))}",
            f"call: {alternatives(names)}",
        ]
        lines += [
            f"{rule}: {json_rule(named_object_schema(t, 'parameters'))}" for rule, t in zip(names, tools)
        ]
        return "\n".join(lines)
