"""Reasoning splitting, alone and chained with tool-call parsing, split at every position."""

from __future__ import annotations

import json

import pytest

from api.output_parser import OutputParser, OutputParsing, ReasoningDelta, parse_whole
from api.reasoning_parsers import ReasoningSplitter
from api.tool_parsers import make_format
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta
from tests.api.tool_goldens import TOOLS

CASES = [  # parser, output, reasoning, answer
    ("qwen3", "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.", "\nThe user wants 2+2.\n", "It is 4."),
    ("qwen3", "It is 4, no <think>ing needed.", "", "It is 4, no <think>ing needed."),
    ("deepseek_r1", "Let me add: 2+2=4.\n</think>\n\nIt is 4.", "Let me add: 2+2=4.\n", "It is 4."),
    ("deepseek_r1", "<think>Short.</think>4", "Short.", "4"),
    ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", ""),
]


def _split(name: str, text: str, cut: int) -> tuple[str, str]:
    splitter = ReasoningSplitter(name)
    pieces = splitter.feed(text[:cut]) + splitter.feed(text[cut:]) + splitter.finish()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    return reasoning, "".join(p.text for p in pieces if p.kind == "answer")


@pytest.mark.parametrize(("name", "text", "reasoning", "answer"), CASES)
def test_split_at_every_position(name, text, reasoning, answer):
    for cut in range(len(text) + 1):
        assert _split(name, text, cut) == (reasoning, answer), f"split at {cut}"


THINK_AND_CALL = (
    "<think>\nI should call get_time, maybe with <tool_call> tags.\n</think>\n\n"
    '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call>'
)
PARSING = OutputParsing(make_format("hermes", TOOLS), frozenset({"get_time"}), "qwen3")


def test_tool_calls_are_read_from_the_answer_never_the_reasoning():
    whole = parse_whole(PARSING, THINK_AND_CALL)
    assert "<tool_call> tags" in whole.reasoning and whole.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [("get_time", {"timezone": "UTC"})]
    for cut in range(len(THINK_AND_CALL) + 1):
        parser = OutputParser(PARSING)
        events = parser.feed(THINK_AND_CALL[:cut]) + parser.feed(THINK_AND_CALL[cut:]) + parser.finish()
        assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == whole.reasoning
        assert not [e for e in events if isinstance(e, TextDelta)]
        assert [e.name for e in events if isinstance(e, CallStart)] == ["get_time"]
        assert "".join(e.text for e in events if isinstance(e, ArgumentsDelta)) == whole.calls[0].arguments


def test_unknown_reasoning_parser_lists_the_choices():
    with pytest.raises(ValueError, match="qwen3, deepseek_r1"):
        ReasoningSplitter("o1")
