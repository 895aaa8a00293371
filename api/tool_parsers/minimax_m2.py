"""MiniMax-M2 tool calls: `<invoke>` elements with one `<parameter>` element per argument, in
`<minimax:tool_call>` tags, several calls to a region.

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

Values are typed from the tool's schema (api/tool_parsers/xml_params.py). Arguments stream one finished
parameter at a time. No MLX, no Ray.
"""

from __future__ import annotations

import re
from typing import Any

from api.tool_parsers.base import (
    MalformedCall,
    PartialCall,
    ToolSpec,
    alternatives,
    dumps,
    lark_string,
    repeat,
    starts_like,
)
from api.tool_parsers.xml_params import lark_regex, parameter_rules, properties_by_tool, typed_value

_INVOKE = re.compile(r"\s*<invoke name=[\"']?([^\"'>]+)[\"']?>")
_PARAMETER = re.compile(r"\s*<parameter name=[\"']?([^\"'>]+)[\"']?>(.*?)</parameter>", re.DOTALL)
_INVOKE_END = re.compile(r"\s*</invoke>")
_VALUE_END = "</parameter>\n"


class MiniMaxM2Format:
    name = "minimax_m2"
    start = "<minimax:tool_call>"
    end: str | None = "</minimax:tool_call>"
    at_start_only = False
    special_tags = True

    def __init__(self, tools: list[ToolSpec] | None = None):
        self._properties = properties_by_tool(tools)

    def read(self, region: str, final: bool) -> list[PartialCall]:
        body, pos, calls = region.removeprefix(self.start), 0, list[PartialCall]()
        while head := _INVOKE.match(body, pos):
            name, pos, arguments = head.group(1), head.end(), dict[str, Any]()
            properties = self._properties.get(name, {})
            while parameter := _PARAMETER.match(body, pos):
                key = parameter.group(1)
                arguments[key] = typed_value(parameter.group(2), properties.get(key))
                pos = parameter.end()
            close = _INVOKE_END.match(body, pos)
            if close is None:
                if final:
                    raise MalformedCall(f"a minimax_m2 call to {name!r} is not closed by </invoke>")
                return [*calls, PartialCall(name, dumps(arguments)[:-1])]
            calls.append(PartialCall(name, dumps(arguments), True))
            pos = close.end()
        if final and (body[pos:].strip() or not calls):
            raise MalformedCall(f"minimax_m2 tool calls do not parse at {body[pos:][:40]!r}")
        return calls

    def begins_call(self, region: str) -> bool:
        return starts_like(region.removeprefix(self.start), "<invoke")

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {lark_string(self.start + chr(10))} {repeat('call', parallel)} {lark_string(self.end or '')}",
            f"call: {alternatives(names)}",
            f"string_value[lazy]: /(?s:.+){lark_regex(_VALUE_END)}/",
        ]
        for rule, tool in zip(names, tools):
            parts, values = parameter_rules(rule, tool, lambda key: (f'<parameter name="{key}">', _VALUE_END))
            head, tail = lark_string(f'<invoke name="{tool["name"]}">\n'), lark_string("</invoke>\n")
            lines += [f"{rule}: {' '.join([head, *parts, tail])}", *values]
        return "\n".join(lines)
