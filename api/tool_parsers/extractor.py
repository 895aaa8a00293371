"""Splits generated text into content and tool calls as it arrives, for one choice.

Owns the streaming rules: text that might be the start of a call tag is held back until it is known not
to be one; a call is announced once its name is known (and allowed), then its arguments stream as
deltas that always add up to the final arguments text. A call region whose name is not one of the
request's tools, or that does not parse when nothing of it was streamed yet, is returned as content
(so a non-streamed response never loses text). A region still open when the output ends (cut by
max_tokens) is never content: its calls are kept as far as they read, arguments cut short (what vLLM
streams), and a call cut before its name is dropped, as is an opener cut short (`<tool_c`); only a
region that does not even begin like a call stays content. Feeding the whole text at once with
`stream=False` gives the non-streaming result. No MLX, no Ray.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass

from api.tool_parsers.base import PartialCall, ToolFormat, tag_overlap


@dataclass
class TextDelta:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class ArgumentsDelta:
    index: int
    text: str


ToolEvent = TextDelta | CallStart | ArgumentsDelta


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object (maybe cut short when the output was)


def new_call_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class ToolCallExtractor:
    def __init__(
        self, fmt: ToolFormat, allowed: set[str] | None, id_prefix: str = "call_", stream: bool = True
    ):
        self._fmt = fmt
        self._openers: tuple[str, ...] = getattr(fmt, "starts", (fmt.start,))
        # Formats whose end tag alone ends a call's last argument (glm45) read a cut region only as cut.
        self._cut_by_end: bool = getattr(fmt, "cut_by_end", False)
        self._allowed = allowed
        self._id_prefix = id_prefix
        self._stream = stream
        self.content = ""
        self.calls: list[ToolCall] = []
        self._held = ""
        self._region: str | None = None
        self._opener_len = 0
        self._first = 0  # index in `calls` of the open region's first call
        self._may_open = True  # at_start_only formats: nothing but whitespace emitted yet
        self._spaces = ""  # whitespace-only text not yet emitted
        self._dropped = False  # a cut call or opener was dropped: whitespace beside it is no content

    def feed(self, text: str) -> list[ToolEvent]:
        if self._region is None:
            self._held += text
        else:
            self._region += text
        return self._advance(final=False)

    def finish(self) -> list[ToolEvent]:
        self._drop_cut_opener()
        out = self._advance(final=True)
        self._flush_spaces(out)
        return out

    def _advance(self, final: bool) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        while self._open_region(out, final) if self._region is None else self._close_region(out, final):
            pass
        return out

    # --- outside a call region -------------------------------------------------------------------

    def _open_region(self, out: list[ToolEvent], final: bool) -> bool:
        found = self._find_opener()
        if found is None:
            keep = 0 if final else self._held_back()
            self._emit_text(out, self._held[: len(self._held) - keep])
            self._held = self._held[len(self._held) - keep :]
            return False
        at, opener = found
        self._emit_text(out, self._held[:at])
        self._region, self._held = self._held[at:], ""
        self._opener_len, self._first = len(opener), len(self.calls)
        return True

    def _find_opener(self) -> tuple[int, str] | None:
        if self._fmt.at_start_only:
            stripped = self._held.lstrip()
            at = len(self._held) - len(stripped)
            hit = [o for o in self._openers if self._may_open and stripped.startswith(o)]
            return (at, hit[0]) if hit else None
        hits = [(i, o) for o in self._openers if (i := self._held.find(o)) >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """How much of the held text's tail might still become an opener."""
        if self._fmt.at_start_only:
            stripped = self._held.lstrip()
            maybe = self._may_open and any(o.startswith(stripped) for o in self._openers)
            return len(self._held) if maybe else 0
        return max((tag_overlap(self._held, o) for o in self._openers), default=0)

    def _drop_cut_opener(self) -> None:
        """An opener cut short by the end of the output (`<tool_c`) is markup, not text."""
        keep = self._held_back() if self._region is None else 0
        if keep and self._held[-keep:].strip():
            self._held, self._dropped = self._held[:-keep], True

    def _emit_text(self, out: list[ToolEvent], text: str) -> None:
        # Until some real text is out, whitespace waits for it: beside calls it is not content.
        text, self._spaces = self._spaces + text, ""
        if not text:  # an empty delta would open an empty Anthropic text block after a call
            return
        if not text.strip() and not self.content:
            self._spaces = text
            return
        self.content += text
        self._may_open = self._may_open and not text.strip()
        out.append(TextDelta(text))

    def _flush_spaces(self, out: list[ToolEvent]) -> None:
        """At the end, held whitespace is content only in an output with no call, even a dropped one."""
        spaces, self._spaces = self._spaces, ""
        if spaces and not self.calls and not self._dropped:
            self.content += spaces
            out.append(TextDelta(spaces))

    # --- inside a call region --------------------------------------------------------------------

    def _close_region(self, out: list[ToolEvent], final: bool) -> bool:
        region, end = self._region or "", self._fmt.end
        at = region.find(end, self._opener_len) if end else -1
        if at >= 0:
            self._region, self._held = None, region[at + len(end or "") :]
            self._finish_region(out, region[:at], end or "")
            return True
        if final:
            self._region = None
            self._finish_region(out, region, "")
            return True
        if self._stream:
            tail = tag_overlap(region, end) if end else 0
            self._stream_region(out, region[: len(region) - tail])
        return False

    def _stream_region(self, out: list[ToolEvent], text: str) -> None:
        for k, call in enumerate(self._read(text, final=False) or []):
            index = self._first + k
            if call.name is None:
                return
            if index == len(self.calls):
                if not self._is_allowed(call.name):
                    if k == 0:
                        self._demote_region(out)
                    return
                self._start_call(out, call.name)
            self._extend(out, index, call.arguments)

    def _finish_region(self, out: list[ToolEvent], text: str, closing: str) -> None:
        """`closing` is "" when the output ended inside the region (or the format has no end tag)."""
        calls = None if self._cut_by_end and not closing else self._read(text, final=True)
        if calls is None and not closing:
            calls = self._read_cut(text)
        if len(self.calls) == self._first:  # nothing of the region streamed yet
            if calls is None or not all(self._is_allowed(c.name) for c in calls):
                self._emit_text(out, text + closing)
                return
            if not calls:  # cut before its first call's name
                self._dropped = True
                return
        for k, call in enumerate(calls or []):
            index = self._first + k
            if index == len(self.calls):
                self._start_call(out, call.name or "")
            self._extend(out, index, call.arguments)

    def _read(self, text: str, final: bool) -> list[PartialCall] | None:
        try:
            return self._fmt.read(text, final)
        except ValueError:
            return None

    def _read_cut(self, text: str) -> list[PartialCall] | None:
        """The named calls of a region the output cut short, as far as they read ([] for a call cut
        before its name); None when the region does not begin like a call, so it is text."""
        tail = tag_overlap(text, self._fmt.end) if self._fmt.end else 0
        calls = self._read(text[: len(text) - tail], final=False) or []
        named = list(itertools.takewhile(lambda call: call.name is not None, calls))
        return named if named or self._fmt.begins_call(text) else None

    def _demote_region(self, out: list[ToolEvent]) -> None:
        """The region is not a call after all: its opener is content, the rest is scanned again."""
        region = self._region or ""
        self._region = None
        self._emit_text(out, region[: self._opener_len])
        self._held = region[self._opener_len :]

    def _is_allowed(self, name: str | None) -> bool:
        return name is not None and (self._allowed is None or name in self._allowed)

    def _start_call(self, out: list[ToolEvent], name: str) -> None:
        call = ToolCall(new_call_id(self._id_prefix), name, "")
        self.calls.append(call)
        out.append(CallStart(len(self.calls) - 1, call.id, name))

    def _extend(self, out: list[ToolEvent], index: int, arguments: str) -> None:
        """Sends what `arguments` adds to what was sent; text already sent is never taken back."""
        sent = self.calls[index].arguments
        if len(arguments) > len(sent) and arguments.startswith(sent):
            self.calls[index].arguments = arguments
            out.append(ArgumentsDelta(index, arguments[len(sent) :]))
