"""Tool-call formats and the streaming extractor, on golden model outputs split at every position."""

from __future__ import annotations

import itertools
import json

import pytest

from api.tool_parsers import auto_name, canonical_name, make_format
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta, ToolCallExtractor
from tests.api.tool_goldens import GOLDENS, TOOLS, Golden

NAMES = {tool["name"] for tool in TOOLS}


def _stream(golden: Golden, cuts: list[int]) -> tuple[str, list[tuple[str, dict]], list]:
    """Feeds the text in pieces cut at `cuts`; returns the streamed content, calls and events."""
    extractor = ToolCallExtractor(make_format(golden.parser, TOOLS), NAMES)
    bounds = [0, *cuts, len(golden.text)]
    events = []
    for start, stop in itertools.pairwise(bounds):
        events += extractor.feed(golden.text[start:stop])
    events += extractor.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    names = {e.index: e.name for e in events if isinstance(e, CallStart)}
    arguments: dict[int, str] = {}
    for event in events:
        if isinstance(event, ArgumentsDelta):
            assert event.index in names, "arguments before their call was announced"
            arguments[event.index] = arguments.get(event.index, "") + event.text
    calls = [(names[i], json.loads(arguments.get(i, "{}"))) for i in sorted(names)]
    return content, calls, events


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.parser}:{g.text[:24]}")
def test_whole_output_parses_into_content_and_calls(golden):
    extractor = ToolCallExtractor(make_format(golden.parser, TOOLS), NAMES, stream=False)
    extractor.feed(golden.text)
    extractor.finish()
    assert extractor.content == golden.content
    assert [(c.name, json.loads(c.arguments)) for c in extractor.calls] == golden.calls


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.parser}:{g.text[:24]}")
def test_split_at_every_position_streams_the_same_result(golden):
    for cut in range(len(golden.text) + 1):
        content, calls, _ = _stream(golden, [cut])
        assert (content, calls) == (golden.content, golden.calls), f"split at {cut}"


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.parser}:{g.text[:24]}")
def test_one_character_at_a_time_streams_arguments_as_deltas(golden):
    content, calls, events = _stream(golden, list(range(1, len(golden.text))))
    assert (content, calls) == (golden.content, golden.calls)
    num_deltas = sum(isinstance(e, ArgumentsDelta) for e in events)
    if golden.calls and golden.parser != "qwen3_coder":  # qwen3_coder streams per parameter
        assert num_deltas > 2 * len(golden.calls)


def test_a_call_to_an_unknown_tool_stays_content():
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    for stream in (False, True):
        extractor = ToolCallExtractor(make_format("hermes", TOOLS), NAMES, stream=stream)
        events = extractor.feed(text[:20]) + extractor.feed(text[20:]) + extractor.finish()
        assert extractor.calls == [] and extractor.content == text
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == text


def test_invalid_json_in_a_whole_output_stays_content():
    text = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": }\n</tool_call>'
    extractor = ToolCallExtractor(make_format("hermes", TOOLS), NAMES, stream=False)
    extractor.feed(text)
    extractor.finish()
    assert extractor.calls == [] and extractor.content == text


def test_a_call_cut_short_keeps_the_arguments_so_far_streamed_or_whole():
    text = 'On it.\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Eur'
    for stream in (True, False):
        extractor = ToolCallExtractor(make_format("hermes", TOOLS), NAMES, stream=stream)
        extractor.feed(text)
        extractor.finish()
        assert [(c.name, c.arguments) for c in extractor.calls] == [("get_time", '{"timezone": "Eur')]
        assert extractor.content == "On it.\n"


def _cut(parser: str, text: str, stream: bool) -> tuple[str, list[tuple[str, str]]]:
    """The content and (name, arguments text) calls of `text` as the whole output, fed at once or one
    character at a time."""
    extractor = ToolCallExtractor(make_format(parser, TOOLS), NAMES, stream=stream)
    for piece in [text] if not stream else text:
        extractor.feed(piece)
    extractor.finish()
    return extractor.content, [(c.name, c.arguments) for c in extractor.calls]


MARKUP = ("<tool", "<function", "[TOOL_CALLS]", "<|python_tag|>", "<｜tool", '{"name"')


@pytest.mark.parametrize("golden", [g for g in GOLDENS if g.calls], ids=lambda g: f"{g.parser}:{g.text[:24]}")
def test_an_output_cut_anywhere_never_leaks_call_markup_as_content(golden):
    """max_tokens can end an output anywhere: inside an opener, before a call's name, inside its
    arguments or its closing tag. Content is then the golden content so far, never markup; calls are
    the golden calls so far, each with a prefix of its final arguments; streamed equals whole."""
    _, whole = _cut(golden.parser, golden.text, stream=False)
    for k in range(len(golden.text) + 1):
        content, calls = _cut(golden.parser, golden.text[:k], stream=False)
        assert golden.content.startswith(content), f"cut at {k}: {content!r}"
        assert not any(tag in content for tag in MARKUP), f"cut at {k}: {content!r}"
        assert len(calls) <= len(whole)
        for (name, arguments), (final_name, final_arguments) in zip(calls, whole):
            assert name == final_name and final_arguments.startswith(arguments), f"cut at {k}"
        assert _cut(golden.parser, golden.text[:k], stream=True) == (content, calls), f"cut at {k}"


@pytest.mark.parametrize(
    ("parser", "text", "calls"),
    [
        ("hermes", "<tool_c", []),
        ("hermes", '<tool_call>\n{"na', []),
        ("hermes", '<tool_call>\n{"name": "get_time", "argu', [("get_time", "")]),
        ("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=time", [("get_time", "{")]),
        ("llama3_json", '{"name": "get_ti', []),
        ("mistral", "[TOOL_CALLS]get_wea", []),
        ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', [("get_weather", '{"city": "Pa')]),
        ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_ti", []),
    ],
)
def test_a_call_cut_before_its_arguments_is_dropped_or_kept_by_name(parser, text, calls):
    for stream in (False, True):
        assert _cut(parser, text, stream) == ("", calls)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", "Wrap calls in a <tool_call> tag"),
        ("llama3_json", '{"answer": 4'),
        ("mistral", "[TOOL_CALLS] sorry, no tool fits"),
    ],
)
def test_an_open_region_that_does_not_begin_like_a_call_stays_content(parser, text):
    for stream in (False, True):
        assert _cut(parser, text, stream) == (text, [])


def test_held_back_tag_prefix_is_released_when_it_is_not_a_tag():
    extractor = ToolCallExtractor(make_format("hermes", TOOLS), NAMES)
    assert extractor.feed("a <tool") == [TextDelta("a ")]
    assert extractor.feed("box> b") == [TextDelta("<toolbox> b")]


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{{ '<｜tool▁calls▁begin｜>' }}", "deepseek"),
        ("[AVAILABLE_TOOLS] {{ tools }} [TOOL_CALLS]", "mistral"),
        ("<tool_call>\n<function={{ tool_call.name }}>", "qwen3_coder"),
        ("<tool_call>\n{{ tool_call.name }}</tool_call>", "hermes"),
        ("{{- '<|python_tag|>' }}", "llama3_json"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),
    ],
)
def test_auto_picks_the_format_the_template_writes(template, name):
    assert auto_name(template) == name


def test_unknown_parser_names_list_the_choices():
    assert canonical_name("qwen") == "hermes"
    with pytest.raises(ValueError, match="choose one of auto, hermes"):
        canonical_name("harmony")


def test_whitespace_beside_calls_is_not_content_but_a_plain_blank_answer_is():
    calls = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n\n'
    with_calls = ToolCallExtractor(make_format("hermes", TOOLS), NAMES)
    streamed = [e for piece in calls for e in with_calls.feed(piece)] + with_calls.finish()
    assert with_calls.content == "" and not [e for e in streamed if isinstance(e, TextDelta)]
    blank = ToolCallExtractor(make_format("hermes", TOOLS), NAMES)
    events = blank.feed(" \n") + blank.finish()
    assert blank.content == " \n" and events == [TextDelta(" \n")]
