"""What every tool-call format shares: the format interface, a parsed call, JSON scanning and grammar parts.

A format knows its tags, how far a half-generated call region can be read (for streaming), how to parse
a finished region (reusing mlx-lm's parsers where they exist), and how to write a Lark grammar (llguidance
dialect) that forces output into the format. Pure logic: no MLX, no Ray.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

ToolSpec = dict[str, Any]  # {"name": ..., "parameters": <JSON schema>}

# Fixed separators make forced calls deterministic in shape (llguidance's JSON options).
_RIGID_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class MalformedCall(ValueError):
    """A finished call region that does not parse into calls."""


@dataclass
class PartialCall:
    """A call as far as it can be read: `arguments` is JSON text, a prefix of the final text until
    `complete`; `name` is None until it is known."""

    name: str | None
    arguments: str = ""
    complete: bool = False


class ToolFormat(Protocol):
    """One model family's tool-call syntax. A call region opens with `start` (or, with `at_start_only`,
    only at the beginning of the output) and closes with `end` (None: it runs to the end of output)."""

    name: str
    start: str
    end: str | None
    at_start_only: bool
    special_tags: bool  # the tags are special tokens, so they must not be skipped in detokenization

    def read(self, region: str, final: bool) -> list[PartialCall]:
        """The calls in a region's text (without its tags). With `final`, the region is whole and
        every call is complete or raises ValueError."""
        ...

    def begins_call(self, region: str) -> bool:
        """Whether a region cut off before its first call's name begins like a call (so dropping it
        loses no answer text) rather than being text that merely opens with the tag."""
        ...

    def grammar(self, tools: list[ToolSpec], parallel: bool) -> str:
        """A Lark grammar whose every sentence is one call (or several with `parallel`) to one of
        `tools`, with schema-valid arguments, in this format, tags included."""
        ...


def scan_json_value(text: str) -> tuple[int, bool]:
    """How far `text` (starting with a JSON object or array) runs: (end, complete). Not complete:
    end is len(text) and every character so far belongs to the value."""
    depth, in_string, escaped = 0, False, False
    for i, char in enumerate(text):
        if in_string:
            escaped = not escaped and char == "\\"
            in_string = escaped or char != '"'
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1, True
    return len(text), False


def tag_overlap(text: str, tag: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `tag` (text to hold back)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def starts_like(text: str, head: str) -> bool:
    """Whether `text`, whitespace aside, is `head` cut short or starts with `head` (which has none)."""
    return head.startswith("".join(text.split())[: len(head)])


def object_arguments(value: Any) -> dict[str, Any]:
    """Arguments must be a JSON object; some models write them as a JSON string of one."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise MalformedCall(f"tool-call arguments must be a JSON object, not {type(value).__name__}")
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- grammar parts -----------------------------------------------------------------------------


def lark_string(text: str) -> str:
    """A Lark string literal matching `text` exactly."""
    return json.dumps(text)


def json_rule(schema: dict[str, Any]) -> str:
    """An llguidance `%json` rule body with rigid separators."""
    return "%json " + json.dumps({**schema, "x-guidance": _RIGID_JSON})


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    schema = tool.get("parameters") or {}
    return {"type": "object", **{k: v for k, v in schema.items() if k != "$schema"}}


def alternatives(rules: list[str]) -> str:
    return " | ".join(rules)


def repeat(rule: str, parallel: bool, separator: str = "") -> str:
    """One `rule`, or with `parallel` one or more separated by `separator` (a Lark literal or "")."""
    if not parallel:
        return rule
    sep = f"{separator} " if separator else ""
    return f"{rule} ({sep}{rule})*"


def read_each(
    pieces: list[str], read_call: Callable[[str, bool], PartialCall | None], final: bool
) -> list[PartialCall]:
    """The calls of `pieces` in order, up to the first one `read_call` cannot read yet (None)."""
    calls = []
    for piece in pieces:
        call = read_call(piece, final)
        if call is None:
            break
        calls.append(call)
    return calls
