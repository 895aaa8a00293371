"""DeepSeek V3 / R1 / V3.1 tool calls, between special tokens, to `<｜tool▁calls▁end｜>`. Two syntaxes:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                                       (V3, R1)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>   (V3.1)

mlx-lm has no parser for it; this one reads both. No MLX, no Ray.
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

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_V3_HEAD = re.compile(rf"\s*function{SEP}([^\n]+)\n```json\n")
_V31_HEAD = re.compile(rf"\s*([^\s<]+?){SEP}")


class DeepSeekFormat:
    name = "deepseek"
    start = CALLS_BEGIN
    end: str | None = CALLS_END
    at_start_only = False
    special_tags = True

    def read(self, region: str, final: bool) -> list[PartialCall]:
        pieces = region.removeprefix(self.start).split(CALL_BEGIN)
        if final and not pieces[1:]:
            raise MalformedCall("deepseek tool calls hold no <｜tool▁call▁begin｜>")
        return read_each(pieces[1:], _read_call, final)

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), CALL_BEGIN)

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {lark_string(self.start)} {repeat('call', parallel)} {lark_string(self.end or '')}",
            f"call: {lark_string(CALL_BEGIN + 'function' + SEP)} body {lark_string(chr(10) + '```' + CALL_END)}",
            f"body: {alternatives(names)}",
        ]
        for rule, tool in zip(names, tools):
            lines.append(f"{rule}: {lark_string(tool['name'] + chr(10) + '```json' + chr(10))} {rule}_args")
            lines.append(f"{rule}_args: {json_rule(arguments_schema(tool))}")
        return "\n".join(lines)


def _read_call(piece: str, final: bool) -> PartialCall | None:
    v3 = piece.lstrip().startswith(f"function{SEP}")
    head = _V3_HEAD.match(piece) if v3 else _V31_HEAD.match(piece)
    if head is None:
        if final:
            raise MalformedCall(f"a deepseek tool call has no name: {piece[:40]!r}")
        return None
    rest = piece[head.end() :].lstrip()
    if not rest.startswith("{"):
        if final:
            raise MalformedCall("a deepseek tool call has no JSON arguments")
        return PartialCall(head.group(1))
    end, complete = scan_json_value(rest)
    call = PartialCall(head.group(1), rest[:end], complete)
    if not final:
        return call
    try:
        arguments = object_arguments(json.loads(rest[:end]))
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"deepseek tool-call arguments are not valid JSON: {exc}") from None
    return PartialCall(call.name, same_json(call, arguments), True)
