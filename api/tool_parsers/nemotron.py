"""Nemotron (Nano 2 / Nemotron-H) tool calls: a JSON array of named objects in `<TOOLCALL>` tags.

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>

Arguments stream as the model's own JSON text. No MLX, no Ray.
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


class NemotronFormat:
    name = "nemotron"
    start = "<TOOLCALL>"
    end: str | None = "</TOOLCALL>"
    at_start_only = False
    special_tags = True

    def read(self, region: str, final: bool) -> list[PartialCall]:
        rest = region.removeprefix(self.start).lstrip()
        if not rest.startswith("["):
            if final:
                raise MalformedCall("nemotron tool calls are not a JSON array")
            return []
        rest, calls = rest[1:].lstrip(), list[PartialCall]()
        while rest.startswith("{"):
            end, _ = scan_json_value(rest)
            call = _parse(rest[:end]) if final else read_named_object(rest[:end])
            if call is None:
                break
            calls.append(call)
            rest = rest[end:].lstrip().removeprefix(",").lstrip()
        if final and (rest.rstrip() != "]" or not calls):
            raise MalformedCall(f"nemotron tool calls do not parse at {rest[:40]!r}")
        return calls

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), '[{"name"')

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        head, tail = lark_string(self.start + "["), lark_string("]" + (self.end or ""))
        lines = [
            f"start: {head} {repeat('call', parallel, lark_string(', '))} {tail}",
            f"call: {alternatives(names)}",
        ]
        lines += [f"{rule}: {json_rule(named_object_schema(tool))}" for rule, tool in zip(names, tools)]
        return "\n".join(lines)


def _parse(text: str) -> PartialCall:
    try:
        call = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"a nemotron tool call is not valid JSON: {exc}") from None
    return named_call(call, text, ("arguments", "parameters"))
