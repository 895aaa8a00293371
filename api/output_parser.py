"""One choice's output text -> reasoning, answer text and tool calls, streamed or whole.

Chains the reasoning splitter (api/reasoning_parsers.py, or api/harmony.py for Harmony) and the
tool-call extractor (api/tool_parsers/extractor.py): tool calls are looked for in the answer only,
never in the reasoning. A format whose calls sit inside a message framing names that framing's
splitter (`framing`), which then runs in place of the configured reasoning parser.
Each dialect renders the events; this module knows no wire format. No MLX, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.harmony import HarmonySplitter
from api.reasoning_parsers import HARMONY, ReasoningSplitter, check_name
from api.tool_parsers.base import ToolFormat
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta, ToolCall, ToolCallExtractor


@dataclass
class ReasoningDelta:
    text: str


OutputEvent = ReasoningDelta | TextDelta | CallStart | ArgumentsDelta


@dataclass(frozen=True)
class OutputParsing:
    """How one request's output is read: `tool_format` None means no tool calls are parsed."""

    tool_format: ToolFormat | None = None
    allowed_tools: frozenset[str] | None = None
    reasoning_parser: str | None = None

    @property
    def active(self) -> bool:
        return self.tool_format is not None or self.reasoning_parser is not None

    @property
    def splitter_name(self) -> str | None:
        return getattr(self.tool_format, "framing", None) or self.reasoning_parser

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the markup read is special tokens, which detokenization must then keep."""
        tags = self.tool_format is not None and self.tool_format.special_tags
        return tags or (self.splitter_name is not None and check_name(self.splitter_name) == HARMONY)


class OutputParser:
    def __init__(self, parsing: OutputParsing, id_prefix: str = "call_", stream: bool = True):
        self._splitter = make_splitter(parsing.splitter_name)
        fmt, allowed = parsing.tool_format, parsing.allowed_tools
        self._tools = ToolCallExtractor(fmt, set(allowed or ()) or None, id_prefix, stream) if fmt else None
        self.reasoning = ""
        self._text = ""  # the answer when no tool format is set

    @property
    def content(self) -> str:
        return self._tools.content if self._tools else self._text

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools else []

    def feed(self, text: str) -> list[OutputEvent]:
        if self._splitter is None:
            return self._answer(text, final=False)
        return self._split(self._splitter.feed(text), final=False)

    def finish(self) -> list[OutputEvent]:
        if self._splitter is None:
            return self._answer("", final=True)
        return self._split(self._splitter.finish(), final=True)

    def _split(self, pieces: list[Any], final: bool) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        answer = ""
        for piece in pieces:
            if piece.kind == "reasoning":
                self.reasoning += piece.text
                out.append(ReasoningDelta(piece.text))
            else:
                answer += piece.text
        return out + self._answer(answer, final)

    def _answer(self, text: str, final: bool) -> list[OutputEvent]:
        if self._tools is None:
            self._text += text
            return [TextDelta(text)] if text else []
        events: list[OutputEvent] = list(self._tools.feed(text)) if text else []
        return events + list(self._tools.finish()) if final else events


def make_splitter(name: str | None) -> ReasoningSplitter | HarmonySplitter | None:
    if name is None:
        return None
    return HarmonySplitter() if check_name(name) == HARMONY else ReasoningSplitter(name)


def parse_whole(parsing: OutputParsing, text: str, id_prefix: str = "call_") -> OutputParser:
    """The non-streaming reading of a finished output."""
    parser = OutputParser(parsing, id_prefix, stream=False)
    parser.feed(text)
    parser.finish()
    return parser
