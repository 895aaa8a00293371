"""Reads gpt-oss's Harmony output, a stream of messages, into reasoning and answer text, as it arrives.

Harmony is not "reasoning, then an answer that may hold calls": each message has a header (channel,
maybe a recipient) and a body, closed by `<|end|>`, `<|return|>` or `<|call|>`:

    <|channel|>analysis<|message|>Need weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}<|call|>

(the chat template's prompt ends with `<|start|>assistant`, so the first header has no `<|start|>`;
`to=` may also stand before `<|channel|>`). So both names read it here first: the reasoning parser
`openai_gptoss` and the tool-call format `openai` (api/tool_parsers/gpt_oss.py, which asks for this
splitter through its `framing`). `analysis` bodies are reasoning; `final` and `commentary` bodies
(preambles), and text outside any header, are answer; a message with a recipient is re-emitted into
the answer as one canonical call region, `<|channel|>commentary to=RECIPIENT<|message|>BODY<|call|>`,
which the `openai` format reads with the shared extractor (streaming, cut and malformed-call rules
included). A closer missing at the end (the model stops on `<|call|>` / `<|return|>`) leaves the region
open, which the extractor reads as finished if it parses; a header, or a marker from `<|` on, cut by
the end is dropped, never text. Markers split across chunks are held back until known. No MLX, no Ray.
"""

from __future__ import annotations

import re
from typing import Literal

from api.reasoning_parsers import ReasoningPiece
from api.tool_parsers.base import tag_overlap
from api.tool_parsers.gpt_oss import CALL, CALL_REGION, CHANNEL, END, MESSAGE, RETURN, START

_CLOSERS = (END, RETURN, CALL)
_HEADER_OPENERS = (START, CHANNEL, "to=")
_BODY_STOPS = (*_CLOSERS, START, CHANNEL)  # a new header without a closer also ends a body
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")

Route = Literal["reasoning", "answer", "call"]


class HarmonySplitter:
    """The Harmony reader behind `openai_gptoss`: same interface as ReasoningSplitter."""

    def __init__(self) -> None:
        self._held = ""
        self._route: Route | None = None  # None: reading a header
        self._spaces = ""  # trailing whitespace of a call body, sent only if more body follows

    def feed(self, text: str) -> list[ReasoningPiece]:
        self._held += text
        out: list[ReasoningPiece] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[ReasoningPiece]:
        out: list[ReasoningPiece] = []
        while self._step(out, final=True):
            pass
        self._held = ""  # a header cut by the end is markup
        return out

    def _step(self, out: list[ReasoningPiece], final: bool) -> bool:
        return self._header(out, final) if self._route is None else self._body(out, final)

    def _header(self, out: list[ReasoningPiece], final: bool) -> bool:
        stripped = self._held.lstrip()
        if not stripped:
            return False
        if not any(o.startswith(stripped[: len(o)]) for o in _HEADER_OPENERS):
            self._held, self._route = stripped, "answer"  # not Harmony: plain text until a marker
            return True
        at = stripped.find(MESSAGE)
        if at < 0:
            return False
        header, self._held = stripped[:at], stripped[at + len(MESSAGE) :]
        recipient, channel = _RECIPIENT.search(header), _CHANNEL_NAME.search(header)
        if recipient is not None:
            self._route = "call"
            _add(out, "answer", f"{CALL_REGION}{recipient.group(1)}{MESSAGE}")
        else:
            self._route = "reasoning" if channel is not None and channel.group(1) == "analysis" else "answer"
        return True

    def _body(self, out: list[ReasoningPiece], final: bool) -> bool:
        hits = [(at, stop) for stop in _BODY_STOPS if (at := self._held.find(stop)) >= 0]
        if hits:
            at, stop = min(hits)
            self._emit(out, self._held[:at])
            self._close(out, closed=True)
            self._held = self._held[at + len(stop) :] if stop in _CLOSERS else self._held[at:]
            return True
        keep = max(tag_overlap(self._held, stop) for stop in _BODY_STOPS)
        cut_marker = final and self._held[len(self._held) - keep :].startswith("<|")
        keep = keep if not final or cut_marker else 0
        self._emit(out, self._held[: len(self._held) - keep])
        self._held = self._held[len(self._held) - keep :]
        if final:
            self._close(out, closed=False)  # a marker cut by the end is dropped with the held text
        return False

    def _emit(self, out: list[ReasoningPiece], text: str) -> None:
        if self._route != "call":
            _add(out, "answer" if self._route == "answer" else "reasoning", text)
            return
        # Whitespace after a call's JSON is no part of its arguments: hold it until more body follows.
        text = self._spaces + text
        body = text.rstrip()
        self._spaces = text[len(body) :]
        _add(out, "answer", body)

    def _close(self, out: list[ReasoningPiece], closed: bool) -> None:
        """Ends the open message; a call region gets its closer only when the model wrote one."""
        if self._route == "call" and closed:
            _add(out, "answer", CALL)
        self._route, self._spaces = None, ""


def _add(out: list[ReasoningPiece], kind: Literal["reasoning", "answer"], text: str) -> None:
    if text:
        out.append(ReasoningPiece(kind, text))
