"""gpt-oss (Harmony) tool calls: a `commentary` message to `functions.NAME` whose body is JSON arguments.

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The output is read by api/harmony.py first (this format's `framing`), which hands the answer here with
each call as `<|channel|>commentary to=functions.NAME<|message|>{...}<|call|>`; the header's content
type (`<|constrain|>json`, ` json`) is accepted too, so raw Harmony calls read the same. Arguments
stream as the model's own JSON text. No MLX, no Ray.
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
    repeat,
    scan_json_value,
    starts_like,
)
from api.tool_parsers.hermes import same_json

# Harmony's special tokens (api/harmony.py reads the messages they frame).
START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
CALL_REGION = CHANNEL + "commentary to="  # the canonical call region's opener
_FUNCTIONS = "functions."
_NAME = re.compile(rf"\s*{re.escape(_FUNCTIONS)}([^\s<]+)")


class HarmonyFormat:
    name = "openai"
    start = CALL_REGION
    end: str | None = CALL
    at_start_only = False
    special_tags = True
    framing = "openai_gptoss"  # api/reasoning_parsers.py HARMONY (importing it here would be circular)

    def read(self, region: str, final: bool) -> list[PartialCall]:
        head, found, body = region.removeprefix(self.start).partition(MESSAGE)
        name = _NAME.match(head)
        if not found or name is None:
            if final:
                raise MalformedCall(f"a Harmony tool call has no to=functions.NAME header: {head[:40]!r}")
            return []
        rest = body.lstrip()
        if not rest.startswith("{"):
            if final:
                raise MalformedCall("a Harmony tool call's body is not a JSON object")
            return [PartialCall(name.group(1))]
        end, complete = scan_json_value(rest)
        call = PartialCall(name.group(1), rest[:end], complete)
        return [_finished(call, rest[end:])] if final else [call]

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), _FUNCTIONS)

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        """Raw Harmony after the prompt's `<|start|>assistant`; gpt-oss stops on `<|call|>`, so in
        practice one call per output even with `parallel`."""
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {repeat('call', parallel, lark_string(START + 'assistant'))}",
            f"call: {lark_string(self.start + _FUNCTIONS)} body {lark_string(self.end or '')}",
            f"body: {alternatives(names)}",
        ]
        for rule, tool in zip(names, tools):
            head = lark_string(f"{tool['name']} {CONSTRAIN}json{MESSAGE}")
            lines.append(f"{rule}: {head} {rule}_args")
            lines.append(f"{rule}_args: {json_rule(arguments_schema(tool))}")
        return "\n".join(lines)


def _finished(call: PartialCall, after: str) -> PartialCall:
    if not call.complete or after.strip():
        raise MalformedCall(f"a Harmony tool call's body is not one JSON object: {after[:40]!r}")
    try:
        arguments = object_arguments(json.loads(call.arguments))
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"Harmony tool-call arguments are not valid JSON: {exc}") from None
    return PartialCall(call.name, same_json(call, arguments), True)
