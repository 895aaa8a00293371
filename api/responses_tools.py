"""Responses tool calling: `tools` / `tool_choice` / `parallel_tool_calls` -> a dialect-neutral `ToolChoice`.

Owns the Responses spellings of a tool choice: 'auto', 'none', 'required', {'type': 'function', 'name'}
and {'type': 'allowed_tools', 'mode', 'tools'}; hosted tool choices are refused by name. Forcing is
enforced by api/tool_choice.py. No Ray, no MLX.
"""

from __future__ import annotations

from typing import Any

from api.errors import invalid, unsupported
from api.responses_schemas import FunctionTool, ResponsesRequest
from api.tool_choice import ToolChoice, check_named, tool_spec
from api.tool_parsers.base import ToolSpec

PARAM = "tool_choice"
_MODES = ("auto", "none", "required")


def tool_choice(req: ResponsesRequest) -> ToolChoice:
    """Expects `check_supported` to have refused every tool that is not a function."""
    functions = [t for t in req.tools or [] if isinstance(t, FunctionTool)]
    specs = [tool_spec(t.name, t.description, t.parameters) for t in functions]
    parallel = req.parallel_tool_calls is not False
    choice = req.tool_choice
    if choice is None or choice in _MODES:
        parsed = ToolChoice(specs, choice or "auto", parallel=parallel)  # type: ignore[arg-type]
    elif isinstance(choice, dict) and choice.get("type") == "function":
        parsed = ToolChoice(specs, "required", _name(choice, PARAM), parallel)
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        parsed = _allowed_tools(choice, specs, parallel)
    elif isinstance(choice, dict) and isinstance(choice.get("type"), str):
        raise unsupported(PARAM, f"tool_choice type {choice['type']!r} is not supported; only function tools")
    else:
        raise invalid(PARAM, "tool_choice is 'none', 'auto', 'required' or {'type': 'function', 'name': ...}")
    check_named(parsed, PARAM)
    return parsed


def _is_function(tool: Any) -> bool:
    return isinstance(tool, FunctionTool)


def _name(entry: dict[str, Any], param: str) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(param, f"'{param}' of type 'function' needs a 'name'")
    return name


def _allowed_tools(choice: dict[str, Any], specs: list[ToolSpec], parallel: bool) -> ToolChoice:
    """Only the listed tools are offered and callable; `mode` 'required' forces a call to one of them."""
    mode, tools = choice.get("mode", "auto"), choice.get("tools")
    if mode not in ("auto", "required"):
        raise invalid(f"{PARAM}.mode", "tool_choice.mode of 'allowed_tools' is 'auto' or 'required'")
    if not isinstance(tools, list) or not tools:
        raise invalid(f"{PARAM}.tools", "tool_choice 'allowed_tools' needs a non-empty 'tools' list")
    offered = {spec["name"] for spec in specs}
    names = set()
    for i, entry in enumerate(tools):
        where = f"{PARAM}.tools[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "function":
            raise unsupported(where, "only {'type': 'function', 'name': ...} entries are supported")
        if (name := _name(entry, where)) not in offered:
            raise invalid(where, f"'{where}' names tool {name!r}, which is not in tools: {sorted(offered)}")
        names.add(name)
    return ToolChoice([s for s in specs if s["name"] in names], mode, parallel=parallel)
