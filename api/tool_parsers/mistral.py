"""Mistral tool calls after the `[TOOL_CALLS]` special token, to the end of the output. Two syntaxes:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]      (v3 tokenizers)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                           (v11+ tokenizers)

Finished regions are parsed by mlx-lm's `mistral` parser. No MLX, no Ray.
"""

from __future__ import annotations

import re

from mlx_lm.tool_parsers import mistral

from api.tool_parsers.base import (
    MalformedCall,
    PartialCall,
    ToolSpec,
    alternatives,
    arguments_schema,
    json_rule,
    lark_string,
    object_arguments,
    repeat,
    scan_json_value,
    starts_like,
)
from api.tool_parsers.hermes import read_named_object, same_json

_HEADER = re.compile(r"\s*([\w-]+)\s*\[ARGS\]\s*")
_NAME = re.compile(r"[\w-]*")


class MistralFormat:
    name = "mistral"
    start = mistral.tool_call_start
    end: str | None = None
    at_start_only = False
    special_tags = True

    def read(self, region: str, final: bool) -> list[PartialCall]:
        body = region.removeprefix(self.start).lstrip()
        partial = _read_array(body) if body.startswith("[") else _read_headers(body)
        if not final:
            return partial
        try:
            parsed = mistral.parse_tool_call(body.replace(self.start, " "))
        except ValueError as exc:
            raise MalformedCall(f"mistral tool calls do not parse: {exc}") from None
        parsed = parsed if isinstance(parsed, list) else [parsed]
        if len(partial) < len(parsed):
            partial += [None] * (len(parsed) - len(partial))  # type: ignore[list-item]
        return [
            PartialCall(call["name"], same_json(seen, object_arguments(call["arguments"])), True)
            for call, seen in zip(parsed, partial)
        ]

    def begins_call(self, region: str) -> bool:
        body = region.removeprefix(self.start).lstrip()
        if body.startswith("["):
            return starts_like(body, '[{"name"')
        name = _NAME.match(body)  # v11: `name[ARGS]`
        name_len = name.end() if name else 0
        return not body or (name_len > 0 and starts_like(body[name_len:], "[ARGS]"))

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [f"start: {repeat('call', parallel)}", f"call: {alternatives(names)}"]
        for rule, tool in zip(names, tools):
            head = lark_string(f"{self.start}{tool['name']}[ARGS]")
            lines.append(f"{rule}: {head} {rule}_args")
            lines.append(f"{rule}_args: {json_rule(arguments_schema(tool))}")
        return "\n".join(lines)


def _read_array(body: str) -> list[PartialCall]:
    calls, rest = [], body[1:].lstrip()
    while rest.startswith("{"):
        end, _ = scan_json_value(rest)
        call = read_named_object(rest[:end])
        if call is None:
            break
        calls.append(call)
        rest = rest[end:].lstrip().removeprefix(",").lstrip()
    return calls


def _read_headers(body: str) -> list[PartialCall]:
    calls, pos = [], 0
    while (head := _HEADER.match(body, pos)) is not None:
        rest = body[head.end() :]
        if not rest.startswith("{"):
            calls.append(PartialCall(head.group(1)))
            break
        end, complete = scan_json_value(rest)
        calls.append(PartialCall(head.group(1), rest[:end], complete))
        pos = head.end() + end
        after = body[pos:].lstrip()
        pos = len(body) - len(after.removeprefix(mistral.tool_call_start))
    return calls
