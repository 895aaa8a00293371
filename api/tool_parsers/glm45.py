"""GLM-4.5 / 4.6 / 4.7 tool calls: the function name, then one key/value element pair per argument, in
`<tool_call>` tags (4.7 drops the newlines).

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are typed from the tool's schema (api/tool_parsers/xml_params.py). Arguments stream one finished
pair at a time. No MLX, no Ray.
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
)
from api.tool_parsers.xml_params import lark_regex, parameter_rules, properties_by_tool, typed_value

_STREAMED_NAME = re.compile(r"\s*([^\s<>]+)\s*(?=<)")  # known once a tag follows it
_NAME = re.compile(r"\s*([^\s<>]+)")
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_BARE_NAME = re.compile(r"\n?[\w.\-]*\s*")
_VALUE_END = "</arg_value>\n"


class Glm45Format:
    name = "glm45"
    start = "<tool_call>"
    end: str | None = "</tool_call>"
    at_start_only = False
    special_tags = True
    # Only `</tool_call>` ends the last argument: a region the output cut short is read as cut.
    cut_by_end = True

    def __init__(self, tools: list[ToolSpec] | None = None):
        self._properties = properties_by_tool(tools)

    def read(self, region: str, final: bool) -> list[PartialCall]:
        body = region.removeprefix(self.start)
        head = (_NAME if final else _STREAMED_NAME).match(body)
        if head is None:
            if final:
                raise MalformedCall("a glm45 tool call has no function name")
            return []
        name, pos, arguments = head.group(1), head.end(), dict[str, Any]()
        properties = self._properties.get(name, {})
        while pair := _PAIR.match(body, pos):
            key = pair.group(1).strip()
            arguments[key] = typed_value(pair.group(2), properties.get(key))
            pos = pair.end()
        if not final:
            return [PartialCall(name, dumps(arguments)[:-1])]
        if body[pos:].strip():
            raise MalformedCall(f"a glm45 tool call has text outside its arguments: {body[pos:][:40]!r}")
        return [PartialCall(name, dumps(arguments), True)]

    def begins_call(self, region: str) -> bool:
        body = region.removeprefix(self.start)
        name = _BARE_NAME.match(body)
        rest = body[name.end() if name else 0 :]
        return "<arg_key>".startswith(rest) or (self.end or "").startswith(rest)

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        names = [f"call_{i}" for i in range(len(tools))]
        lines = [
            f"start: {repeat('call', parallel, lark_string(chr(10)))}",
            f"call: {lark_string(self.start)} body {lark_string(self.end or '')}",
            f"body: {alternatives(names)}",
            f"string_value[lazy]: /(?s:.+){lark_regex(_VALUE_END)}/",
        ]
        for rule, tool in zip(names, tools):
            parts, values = parameter_rules(
                rule, tool, lambda key: (f"<arg_key>{key}</arg_key>\n<arg_value>", _VALUE_END)
            )
            lines += [f"{rule}: {' '.join([lark_string(tool['name'] + chr(10)), *parts])}", *values]
        return "\n".join(lines)
