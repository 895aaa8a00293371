"""Responses tool calling: `tools` / `tool_choice` / `parallel_tool_calls` -> a dialect-neutral `ToolChoice`.

Owns which Responses tools the model sees: function tools as they are, the function tools of a
`namespace` tool flattened to '<namespace>__<name>' (`ToolNames` maps a call's name back), hosted tools
dropped (this server runs none; the response echoes them and holds no call of theirs), every other type
refused by name. Owns the spellings of a tool choice: 'auto', 'none', 'required', {'type': 'function',
'name', 'namespace'?} and {'type': 'allowed_tools', 'mode', 'tools'}; forcing a hosted tool is a 400.
Forcing is enforced by api/tool_choice.py. No Ray, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.errors import invalid, unsupported
from api.responses_schemas import FunctionTool, NamespaceTool, OtherTool, ResponsesRequest
from api.tool_choice import ToolChoice, check_named, tool_spec
from api.tool_parsers.base import ToolSpec

PARAM = "tool_choice"
_MODES = ("auto", "none", "required")
SEPARATOR = "__"  # Codex names its flat MCP tools 'mcp__<server>__<tool>' the same way
# Tools OpenAI runs on its side. None runs here: they are dropped from what the model sees, and
# `tool_search` with them, since every deferred tool is offered up front.
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer_use",
        "computer",
        "mcp",
        "tool_search",
    }
)


def flat_name(namespace: str | None, name: str) -> str:
    """The name the model sees (and writes in its calls) for a function tool of `namespace`."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


@dataclass(frozen=True)
class ToolNames:
    """Flattened names of namespace members -> (namespace, name), to report calls as declared."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)

    def original(self, flat: str) -> tuple[str | None, str]:
        return self.namespaced.get(flat, (None, flat))


# --- checks ------------------------------------------------------------------------------------


def check_tools(req: ResponsesRequest) -> None:
    """Refuses the tools this server can neither offer the model nor drop without breaking the client."""
    for i, tool in enumerate(req.tools or []):
        where = f"tools[{i}]"
        if isinstance(tool, NamespaceTool):
            for j, member in enumerate(tool.tools):
                if not isinstance(member, FunctionTool):
                    detail = f"a namespace holds function tools only, not {member.type!r} tools"
                    raise unsupported(f"{where}.tools[{j}]", detail)
        elif isinstance(tool, OtherTool):
            _check_other(where, tool)


def _check_other(where: str, tool: OtherTool) -> None:
    if tool.type == "mcp" and (tool.model_extra or {}).get("server_url"):
        raise unsupported(
            f"{where}.server_url", "this server connects to no MCP servers; run the MCP client side"
        )
    if tool.type not in HOSTED_TOOLS:
        raise unsupported(
            where, f"tool type {tool.type!r} is not supported yet; declare it as a 'function' tool"
        )


# --- the tools the model sees ------------------------------------------------------------------


def offered_functions(req: ResponsesRequest) -> tuple[list[ToolSpec], ToolNames]:
    """Function tools as the template and the tool parser see them; expects `check_tools` to have run."""
    specs: list[ToolSpec] = []
    namespaced: dict[str, tuple[str, str]] = {}
    for tool in req.tools or []:
        if isinstance(tool, FunctionTool):
            specs.append(tool_spec(tool.name, tool.description, tool.parameters))
        elif isinstance(tool, NamespaceTool):
            for member in _functions(tool):
                flat = flat_name(tool.name, member.name)
                namespaced[flat] = (tool.name, member.name)
                specs.append(tool_spec(flat, _member_description(tool, member), member.parameters))
    _check_unique(specs)
    return specs, ToolNames(namespaced)


def _functions(namespace: NamespaceTool) -> list[FunctionTool]:
    return [member for member in namespace.tools if isinstance(member, FunctionTool)]


def tool_names(req: ResponsesRequest) -> ToolNames:
    return offered_functions(req)[1]


def _member_description(namespace: NamespaceTool, member: FunctionTool) -> str | None:
    if not namespace.description:
        return member.description
    return f"{member.description or ''}\n\n{namespace.name}: {namespace.description}".strip()


def _check_unique(specs: list[ToolSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec["name"] in seen:
            raise invalid(
                "tools",
                f"two tools are named {spec['name']!r} (a namespace's tools are named "
                f"'<namespace>{SEPARATOR}<name>'); give each tool its own name",
            )
        seen.add(spec["name"])


# --- tool choice -------------------------------------------------------------------------------


def tool_choice(req: ResponsesRequest) -> ToolChoice:
    """Expects `check_tools` to have refused every tool that cannot be offered."""
    specs, names = offered_functions(req)
    parallel = req.parallel_tool_calls is not False
    choice = req.tool_choice
    if choice is None or choice in _MODES:
        parsed = ToolChoice(specs, choice or "auto", parallel=parallel)  # type: ignore[arg-type]
    elif isinstance(choice, dict) and choice.get("type") == "function":
        parsed = ToolChoice(specs, "required", _resolve(choice, PARAM, specs, names), parallel)
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        parsed = _allowed_tools(choice, specs, names, parallel)
    elif isinstance(choice, dict) and isinstance(choice.get("type"), str):
        raise unsupported(PARAM, _forced_detail(choice["type"]))
    else:
        raise invalid(PARAM, "tool_choice is 'none', 'auto', 'required' or {'type': 'function', 'name': ...}")
    check_named(parsed, PARAM)
    return parsed


def _forced_detail(kind: str) -> str:
    if kind in HOSTED_TOOLS:
        return f"it forces the hosted tool {kind!r}, which this server does not run"
    return f"tool_choice type {kind!r} is not supported; only function tools can be forced"


def _resolve(entry: dict[str, Any], param: str, specs: list[ToolSpec], names: ToolNames) -> str:
    """A named function as the model sees it: '<namespace>__<name>' when a namespace is given, else the
    name itself, else the one namespace member of that name."""
    name, namespace = entry.get("name"), entry.get("namespace")
    if not isinstance(name, str) or not name:
        raise invalid(param, f"'{param}' of type 'function' needs a 'name'")
    if isinstance(namespace, str) and namespace:
        return flat_name(namespace, name)
    if any(spec["name"] == name for spec in specs):
        return name
    members = [flat for flat, (_, bare) in names.namespaced.items() if bare == name]
    return members[0] if len(members) == 1 else name


def _allowed_tools(
    choice: dict[str, Any], specs: list[ToolSpec], names: ToolNames, parallel: bool
) -> ToolChoice:
    """Only the listed functions are offered and callable (listed hosted tools are not run);
    `mode` 'required' forces a call to one of them."""
    mode, tools = choice.get("mode", "auto"), choice.get("tools")
    if mode not in ("auto", "required"):
        raise invalid(f"{PARAM}.mode", "tool_choice.mode of 'allowed_tools' is 'auto' or 'required'")
    if not isinstance(tools, list) or not tools:
        raise invalid(f"{PARAM}.tools", "tool_choice 'allowed_tools' needs a non-empty 'tools' list")
    offered = {spec["name"] for spec in specs}
    allowed = set()
    for i, entry in enumerate(tools):
        where = f"{PARAM}.tools[{i}]"
        if isinstance(entry, dict) and entry.get("type") in HOSTED_TOOLS:
            continue
        if not isinstance(entry, dict) or entry.get("type") != "function":
            raise unsupported(
                where, "only {'type': 'function', 'name': ...} and hosted tool entries are supported"
            )
        if (name := _resolve(entry, where, specs, names)) not in offered:
            raise invalid(where, f"'{where}' names tool {name!r}, which is not in tools: {sorted(offered)}")
        allowed.add(name)
    if mode == "required" and not allowed:
        raise unsupported(f"{PARAM}.tools", "it forces only hosted tools, which this server does not run")
    return ToolChoice([s for s in specs if s["name"] in allowed], mode, parallel=parallel)
