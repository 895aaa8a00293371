"""gpt-oss Harmony output through the output parser (reasoning `openai_gptoss`, tool format `openai`),
whole and streamed in random chunks, cut anywhere, and malformed."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from engine.messages import SamplingParams

import pytest

from api.harmony import HarmonySplitter
from api.output_parser import OutputParser, OutputParsing, ReasoningDelta, parse_whole
from api.reasoning_parsers import HARMONY, check_name
from api.tool_choice import ToolChoice, apply, output_parsing
from api.tool_parsers import make_format
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta
from tests.api.tool_goldens import TOOLS

NAMES = frozenset(tool["name"] for tool in TOOLS)
BOTH = OutputParsing(make_format("openai", TOOLS), NAMES, "openai_gptoss")
TOOLS_ONLY = OutputParsing(make_format("harmony", TOOLS), NAMES)  # the format brings its own framing
WEATHER_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city":"Paris","unit":"celsius"}<|call|>'
)
WEATHER = {"city": "Paris", "unit": "celsius"}


@dataclass
class Case:
    id: str
    text: str
    reasoning: str
    content: str
    calls: list[tuple[str, dict]] = field(default_factory=list)


CASES = [
    Case(
        "answer",
        "<|channel|>analysis<|message|>User asks X. Answer.<|end|><|start|>assistant<|channel|>final"
        "<|message|>The answer is 4.<|return|>",
        "User asks X. Answer.",
        "The answer is 4.",
    ),
    Case(
        "call",
        "<|channel|>analysis<|message|>Need weather.<|end|>" + WEATHER_CALL,
        "Need weather.",
        "",
        [("get_weather", WEATHER)],
    ),
    Case(
        "recipient_before_channel",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
        '<|channel|>commentary json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>',
        "Need weather.",
        "",
        [("get_weather", WEATHER)],
    ),
    Case(  # the first header right after the prompt's `<|start|>assistant`; stopped on <|call|> (EOS)
        "first_header_call_no_closer",
        ' to=functions.get_time<|channel|>commentary json<|message|>{"timezone": "UTC"} ',
        "",
        "",
        [("get_time", {"timezone": "UTC"})],
    ),
    Case(
        "two_calls",
        "<|channel|>analysis<|message|>Both.<|end|>"
        + WEATHER_CALL
        + "<|start|>assistant<|channel|>commentary to=functions.get_time<|message|>"
        + '{"timezone": "UTC"}<|call|>',
        "Both.",
        "",
        [("get_weather", WEATHER), ("get_time", {"timezone": "UTC"})],
    ),
    Case(
        "preamble",
        "<|channel|>analysis<|message|>Say what I do.<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking the weather.<|end|>" + WEATHER_CALL,
        "Say what I do.",
        "Checking the weather.",
        [("get_weather", WEATHER)],
    ),
    Case(  # stopped on <|return|> (EOS), so the closer is not in the text
        "final_no_closer",
        "<|channel|>analysis<|message|>Easy: 2 < 3.<|end|><|start|>assistant<|channel|>final<|message|>"
        "Yes, 2 < 3.",
        "Easy: 2 < 3.",
        "Yes, 2 < 3.",
    ),
    Case("not_harmony", "Plain text, no markup.", "", "Plain text, no markup."),
]


def _run(parsing: OutputParsing, text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    """Streams `text` cut at `cuts`; checks the events add up to the parser's result and returns it."""
    parser, events, at = OutputParser(parsing), [], 0
    for cut in [*cuts, len(text)]:
        events += parser.feed(text[at:cut])
        at = cut
    events += parser.finish()
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == parser.reasoning
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == parser.content
    assert [e.name for e in events if isinstance(e, CallStart)] == [c.name for c in parser.calls]
    for index, call in enumerate(parser.calls):
        deltas = [e.text for e in events if isinstance(e, ArgumentsDelta) and e.index == index]
        assert "".join(deltas) == call.arguments
    return parser.reasoning, parser.content, [(c.name, c.arguments) for c in parser.calls]


def _decoded(calls: list[tuple[str, str]]) -> list[tuple[str, dict]]:
    return [(name, json.loads(arguments)) for name, arguments in calls]


@pytest.mark.parametrize("parsing", [BOTH, TOOLS_ONLY], ids=["both", "tools_only"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_whole_output_splits_into_reasoning_content_and_calls(case, parsing):
    whole = parse_whole(parsing, case.text)
    assert (whole.reasoning, whole.content) == (case.reasoning, case.content)
    assert _decoded([(c.name, c.arguments) for c in whole.calls]) == case.calls


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("seed", range(5))
def test_random_chunks_stream_the_same_result(case, seed):
    rng, cuts, at = random.Random(seed), [], 0
    while (at := at + rng.randint(1, 8)) < len(case.text):
        cuts.append(at)
    reasoning, content, calls = _run(BOTH, case.text, cuts)
    assert (reasoning, content, _decoded(calls)) == (case.reasoning, case.content, case.calls)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_split_at_every_position_streams_the_same_result(case):
    for cut in range(len(case.text) + 1):
        reasoning, content, calls = _run(BOTH, case.text, [cut])
        assert (reasoning, content, _decoded(calls)) == (case.reasoning, case.content, case.calls), cut


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_an_output_cut_anywhere_leaks_no_markup(case):
    """max_tokens can end the output inside any header, body or marker: reasoning and content are then
    the final ones so far, never markup; calls are named calls so far; streamed equals whole."""
    for k in range(len(case.text) + 1):
        whole = parse_whole(BOTH, case.text[:k])
        assert "<|" not in whole.content and "<|" not in whole.reasoning, f"cut at {k}"
        # A lone `<` at the end may be text ("2 <"); markers are single special tokens in practice.
        assert case.content.startswith(whole.content.removesuffix("<"))
        assert case.reasoning.startswith(whole.reasoning.removesuffix("<"))
        assert [c.name for c in whole.calls] == [name for name, _ in case.calls][: len(whole.calls)]
        result = (whole.reasoning, whole.content, [(c.name, c.arguments) for c in whole.calls])
        assert _run(BOTH, case.text[:k], list(range(1, k))) == result, f"cut at {k}"


def test_reasoning_parser_alone_splits_analysis_from_final():
    case = CASES[0]
    for name in ("openai_gptoss", "gpt_oss"):
        whole = parse_whole(OutputParsing(reasoning_parser=name), case.text)
        assert (whole.reasoning, whole.content, whole.calls) == (case.reasoning, case.content, [])


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (  # arguments that are not JSON: the canonical region stays text, as every format's does
            '<|channel|>commentary to=functions.get_time<|message|>{"timezone": }<|call|>',
            '<|channel|>commentary to=functions.get_time<|message|>{"timezone": }<|call|>',
        ),
        (  # a tool the request did not offer
            "<|channel|>commentary to=functions.rm_rf<|message|>{}<|call|>",
            "<|channel|>commentary to=functions.rm_rf<|message|>{}<|call|>",
        ),
        (  # text between messages, and a channel Harmony does not define
            "<|channel|>final<|message|>A<|end|> stray <|start|>assistant<|channel|>weird<|message|>B<|end|>",
            "Astray B",  # whitespace between messages is not content
        ),
        ("<|channel|>final without a message marker<|end|>", ""),  # a header never ended is markup
    ],
)
def test_malformed_output_stays_text_or_is_dropped_without_a_crash(text, content):
    whole = parse_whole(BOTH, text)
    assert (whole.content, whole.calls) == (content, [])
    for cut in range(len(text) + 1):
        _run(BOTH, text, [cut])  # streamed, a call already announced stays a call; nothing raises


def test_streamed_arguments_arrive_as_deltas_without_trailing_whitespace():
    text = '<|channel|>commentary to=functions.get_time<|message|>{"timezone": "UTC"}  \n<|call|>'
    parser = OutputParser(BOTH)
    events = [e for char in text for e in parser.feed(char)] + parser.finish()
    assert sum(isinstance(e, ArgumentsDelta) for e in events) > 5
    assert [c.arguments for c in parser.calls] == ['{"timezone": "UTC"}']


def test_harmony_keeps_special_tokens_with_either_name():
    for parsing in (
        output_parsing(ToolChoice(), None, "gpt_oss"),
        output_parsing(ToolChoice(TOOLS), "openai", None),
    ):
        params = SamplingParams()
        apply(ToolChoice(), parsing, params, "tools")
        assert params.skip_special_tokens is False
    params = SamplingParams()
    apply(ToolChoice(), output_parsing(ToolChoice(), None, "qwen3"), params, "tools")
    assert params.skip_special_tokens is True


def test_names_and_framing_agree():
    assert check_name("gpt_oss") == HARMONY == make_format("gpt_oss", TOOLS).framing
    assert HarmonySplitter().feed("<|channel|>analysis<|message|>Hm") != []
