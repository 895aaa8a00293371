"""Anthropic stream content blocks from parsed output events: thinking, text and tool_use blocks, each
opened (content_block_start) when its first piece arrives and stopped when the next kind begins.

Owns block indexes and the delta types: thinking_delta, text_delta, input_json_delta (a tool's
arguments as they stream). No Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from api.output_parser import OutputEvent, ReasoningDelta
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta

Frame = Callable[..., str]  # (event name, **fields) -> one SSE frame


class BlockStream:
    def __init__(self, event: Frame):
        self._event = event
        self._index = -1
        self._kind: str | None = None  # the open block's type
        self.num_tool_uses = 0

    def frames(self, events: list[OutputEvent]) -> list[str]:
        out: list[str] = []
        for item in events:
            if isinstance(item, ReasoningDelta):
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": item.text}))
            elif isinstance(item, TextDelta):
                out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": item.text}))
            elif isinstance(item, CallStart):
                self.num_tool_uses += 1
                block = {"type": "tool_use", "id": item.id, "name": item.name, "input": {}}
                out += self._open("tool_use", block, always=True)
            elif isinstance(item, ArgumentsDelta):
                out.append(self._delta({"type": "input_json_delta", "partial_json": item.text}))
        return out

    def close(self) -> list[str]:
        """Stops the open block; a message with no block at all gets one empty text block."""
        out = [] if self._kind is not None else self._open("text", {"type": "text", "text": ""})
        out.append(self._event("content_block_stop", index=self._index))
        self._kind = None
        return out

    def _open(self, kind: str, block: dict[str, Any], always: bool = False) -> list[str]:
        if self._kind == kind and not always:
            return []
        out = [self._event("content_block_stop", index=self._index)] if self._kind is not None else []
        self._index += 1
        self._kind = kind
        out.append(self._event("content_block_start", index=self._index, content_block=block))
        return out

    def _delta(self, delta: dict[str, Any]) -> str:
        return self._event("content_block_delta", index=self._index, delta=delta)
