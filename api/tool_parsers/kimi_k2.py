"""Kimi K2 tool calls: `functions.NAME:INDEX` and JSON arguments per call, between special tokens.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

Arguments stream as the model's own JSON text. No MLX, no Ray.
"""

from __future__ import annotations

import json
import re

from api.tool_parsers.base import (
    MalformedCall,
    PartialCall,
    ToolSpec,
    alternatives,
    arguments_schema,
    json_rule,
    lark_string,
    object_arguments,
    read_each,
    repeat,
    scan_json_value,
    starts_like,
)
from api.tool_parsers.hermes import same_json

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENTS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_HEAD = re.compile(rf"\s*(?:functions\.)?([^\s:<]+):\d+\s*{re.escape(ARGUMENTS_BEGIN)}\s*")


class KimiK2Format:
    name = "kimi_k2"
    start = SECTION_BEGIN
    end: str | None = SECTION_END
    at_start_only = False
    special_tags = True

    def read(self, region: str, final: bool) -> list[PartialCall]:
        pieces = region.removeprefix(self.start).split(CALL_BEGIN)
        if final and (pieces[0].strip() or not pieces[1:]):
            raise MalformedCall("kimi_k2 tool calls hold no <|tool_call_begin|>")
        return read_each(pieces[1:], _read_call, final)

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), CALL_BEGIN)

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {lark_string(self.start)} {repeat('call', parallel)} {lark_string(self.end or '')}",
            f"call: {lark_string(CALL_BEGIN + 'functions.')} body {lark_string(CALL_END)}",
            f"body: {alternatives(names)}",
        ]
        for rule, tool in zip(names, tools):
            head = f"{lark_string(tool['name'] + ':')} /[0-9]+/ {lark_string(ARGUMENTS_BEGIN)}"
            lines.append(f"{rule}: {head} {rule}_args")
            lines.append(f"{rule}_args: {json_rule(arguments_schema(tool))}")
        return "\n".join(lines)


def _read_call(piece: str, final: bool) -> PartialCall | None:
    head = _HEAD.match(piece)
    if head is None:
        if final:
            raise MalformedCall(f"a kimi_k2 tool call has no functions.NAME:INDEX head: {piece[:40]!r}")
        return None
    rest = piece[head.end() :]
    if not rest.startswith("{"):
        if final:
            raise MalformedCall("a kimi_k2 tool call has no JSON arguments")
        return PartialCall(head.group(1))
    end, complete = scan_json_value(rest)
    call = PartialCall(head.group(1), rest[:end], complete)
    if not final:
        return call
    if rest[end:].strip().removeprefix(CALL_END).strip():
        raise MalformedCall(f"text after kimi_k2 tool-call arguments: {rest[end:][:40]!r}")
    try:
        arguments = object_arguments(json.loads(rest[:end]))
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"kimi_k2 tool-call arguments are not valid JSON: {exc}") from None
    return PartialCall(call.name, same_json(call, arguments), True)
