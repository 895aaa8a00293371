"""OpenAI chat tool calling: `tools` / `tool_choice` / `parallel_tool_calls` -> a `ToolChoice`, assistant
`tool_calls` and `tool` messages -> chat-template turns, and parsed output -> `message.tool_calls`,
`reasoning` and streamed `delta.tool_calls` / `delta.reasoning`. No Ray, no MLX.
"""

from __future__ import annotations

import json
from typing import Any

from api.errors import invalid
from api.output_parser import OutputEvent, OutputParser, ReasoningDelta
from api.template_messages import Tool, function_tool, tool_call
from api.tool_choice import ToolChoice, check_named, tool_spec
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta


def tool_choice(tools: list[dict[str, Any]] | None, choice: Any, parallel: bool | None) -> ToolChoice:
    specs = [_spec(i, tool) for i, tool in enumerate(tools or [])]
    parsed = ToolChoice(specs, parallel=parallel is not False)
    if choice in (None, "auto"):
        pass
    elif choice in ("none", "required"):
        parsed = ToolChoice(specs, choice, parallel=parsed.parallel)
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice", "tool_choice {'type': 'function'} needs function.name")
        parsed = ToolChoice(specs, "required", name, parsed.parallel)
    else:
        raise invalid("tool_choice", "tool_choice is 'none', 'auto', 'required' or a named function")
    check_named(parsed, "tool_choice")
    return parsed


def _spec(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise invalid(f"tools[{i}]", f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise invalid(f"tools[{i}].function.name", f"tools[{i}].function.name is required")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid(f"tools[{i}].function.parameters", "parameters must be a JSON schema object")
    return tool_spec(function["name"], function.get("description"), parameters)


def template_tools(choice: ToolChoice) -> list[Tool] | None:
    """Tool definitions for the template; none with tool_choice 'none', so the model cannot call one."""
    if not choice.tools or choice.mode == "none":
        return None
    return [function_tool(t["name"], t["description"], t["parameters"]) for t in choice.tools]


def template_calls(i: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` (arguments as a JSON string) -> template tool calls."""
    out = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (json.JSONDecodeError, TypeError):
            raise invalid(where, f"{where}.function.arguments is not a JSON string") from None
        if not isinstance(function.get("name"), str) or not isinstance(arguments, dict):
            raise invalid(where, f"{where} needs function.name and JSON-object arguments")
        out.append(tool_call(str(call.get("id") or f"call_{i}_{j}"), function["name"], arguments))
    return out


# --- output ------------------------------------------------------------------------------------


def message_fields(parser: OutputParser) -> dict[str, Any]:
    """`message` fields beyond role: content (null when only calls came), tool_calls, reasoning."""
    fields: dict[str, Any] = {"content": parser.content}
    if parser.calls:
        fields["tool_calls"] = [_call(c.id, c.name, c.arguments) for c in parser.calls]
        if not parser.content.strip():
            fields["content"] = None
    if parser.reasoning:
        fields["reasoning"] = fields["reasoning_content"] = parser.reasoning
    return fields


def delta_fields(events: list[OutputEvent]) -> dict[str, Any]:
    """One chunk's `delta` fields from one batch's events; a call's first delta has id, type, name."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        if isinstance(event, CallStart):
            calls[event.index] = {"index": event.index, **_call(event.id, event.name, "")}
        elif isinstance(event, ArgumentsDelta):
            entry = calls.setdefault(event.index, {"index": event.index, "function": {"arguments": ""}})
            entry["function"]["arguments"] += event.text
    fields: dict[str, Any] = {}
    if text:
        fields["content"] = text
    if reasoning:
        fields["reasoning"] = fields["reasoning_content"] = reasoning
    if calls:
        fields["tool_calls"] = list(calls.values())
    return fields


def finish_reason(reason: str | None, parser: OutputParser | None) -> str | None:
    return "tool_calls" if reason == "stop" and parser is not None and parser.calls else reason


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
