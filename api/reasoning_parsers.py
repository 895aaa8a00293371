"""Splits generated text into reasoning and the answer, for `<think>...</think>` models, as it arrives.

Two parsers: `qwen3` (reasoning only when the output opens with `<think>`; Qwen3 with thinking off, or
any model that never thinks, is all answer) and `deepseek_r1` (the template opens `<think>` in the
prompt, so the output is reasoning until `</think>`; a leading `<think>` is dropped; an output that never
closes it is all reasoning). Text that might be part of a tag is held back until it is known.
The names also cover `openai_gptoss` (alias `gpt_oss`), whose Harmony messages api/harmony.py reads.
No MLX, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from api.tool_parsers.base import tag_overlap

HARMONY = "openai_gptoss"
_ALIASES = {"gpt_oss": HARMONY}
REASONING_PARSER_NAMES = ("qwen3", "deepseek_r1", HARMONY, *_ALIASES)
THINK_START, THINK_END = "<think>", "</think>"


@dataclass
class ReasoningPiece:
    kind: Literal["reasoning", "answer"]
    text: str


def check_name(name: str) -> str:
    """`name` or its alias's target; raises ValueError naming the choices for an unknown one."""
    if name not in REASONING_PARSER_NAMES:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSER_NAMES)}"
        )
    return _ALIASES.get(name, name)


class ReasoningSplitter:
    def __init__(self, name: str):
        name = check_name(name)
        if name == HARMONY:
            raise ValueError(
                f"{HARMONY} output is Harmony messages: read it with api.harmony.HarmonySplitter"
            )
        self._starts_in_reasoning = name == "deepseek_r1"
        self._state: Literal["opening", "reasoning", "answer"] = "opening"
        self._held = ""
        self._answer_started = False  # whitespace right after </think> is dropped

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
        return out

    def _step(self, out: list[ReasoningPiece], final: bool) -> bool:
        """Handles what it can of the held text; True when the state changed (step again)."""
        if self._state == "opening":
            return self._open(final)
        if self._state == "reasoning":
            return self._reason(out, final)
        self._answer(out)
        return False

    def _open(self, final: bool) -> bool:
        stripped = self._held.lstrip()
        if stripped.startswith(THINK_START):
            self._held, self._state = stripped[len(THINK_START) :], "reasoning"
            return True
        if not final and THINK_START.startswith(stripped):
            return False  # maybe the start of <think>
        self._state = "reasoning" if self._starts_in_reasoning else "answer"
        self._answer_started = self._state == "answer"  # no </think>: the answer is kept as it is
        return True

    def _reason(self, out: list[ReasoningPiece], final: bool) -> bool:
        at = self._held.find(THINK_END)
        if at >= 0:
            _add(out, "reasoning", self._held[:at])
            self._held, self._state = self._held[at + len(THINK_END) :], "answer"
            return True
        keep = 0 if final else tag_overlap(self._held, THINK_END)
        _add(out, "reasoning", self._held[: len(self._held) - keep])
        self._held = self._held[len(self._held) - keep :]
        return False

    def _answer(self, out: list[ReasoningPiece]) -> None:
        if not self._answer_started:
            self._held = self._held.lstrip()
            self._answer_started = bool(self._held)
        _add(out, "answer", self._held)
        self._held = ""


def _add(out: list[ReasoningPiece], kind: Literal["reasoning", "answer"], text: str) -> None:
    if text:
        out.append(ReasoningPiece(kind, text))
