"""Tool-call formats and the streaming extractor, on golden model outputs split at every position."""

from __future__ import annotations

import itertools
import json
import random

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


PER_PARAMETER = {"qwen3_coder", "glm45", "minimax_m2", "lfm2"}  # stream one finished argument at a time


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.parser}:{g.text[:24]}")
@pytest.mark.parametrize("seed", range(5))
def test_random_small_chunks_stream_the_same_result(golden, seed):
    rng, cuts, at = random.Random(seed), [], 0
    while (at := at + rng.randint(1, 6)) < len(golden.text):
        cuts.append(at)
    content, calls, _ = _stream(golden, cuts)
    assert (content, calls) == (golden.content, golden.calls)


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.parser}:{g.text[:24]}")
def test_one_character_at_a_time_streams_arguments_as_deltas(golden):
    content, calls, events = _stream(golden, list(range(1, len(golden.text))))
    assert (content, calls) == (golden.content, golden.calls)
    num_deltas = sum(isinstance(e, ArgumentsDelta) for e in events)
    if golden.calls and golden.parser not in PER_PARAMETER:
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


MARKUP = (
    "<tool",
    "<function",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<｜tool",
    '{"name"',
    "<|tool",
    "<minimax",
    "<TOOLCALL",
    "<|channel",
    "<|call",
)


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
        ("glm45", "<tool_call>get_ti", []),
        ("glm45", "<tool_call>get_time\n<arg_key>time", [("get_time", "{")]),
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_ti", []),
        ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_ti', []),
        ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_time">\n<parameter', [("get_time", "{")]),
        ("nemotron", '<TOOLCALL>[{"name": "get_ti', []),
        ("lfm2", "<|tool_call_start|>[get_ti", []),
        ("lfm2", "<|tool_call_start|>[get_time(timezone='UT", [("get_time", "{")]),
        ("openai", "<|channel|>commentary to=functions.get_ti", []),
        ("openai", '<|channel|>commentary to=functions.get_time<|message|>{"time', [("get_time", '{"time')]),
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
        ("glm45", "Wrap calls in a <tool_call> tag"),
        ("nemotron", "Calls go in <TOOLCALL> tags"),
        ("lfm2", "Calls go after <|tool_call_start|> and end"),
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
        ("<tool_call>{{ tc.name }}\n<arg_key>{{ k }}</arg_key>", "glm45"),
        ("{{ '<|tool_calls_section_begin|>' }}<|tool_call_begin|>", "kimi_k2"),
        ('<minimax:tool_call>\n<invoke name="{{ tc.name }}">', "minimax_m2"),
        ("Call tools as <TOOLCALL>[...]</TOOLCALL>; <tool_call> is not used", "nemotron"),
        ("List of tools: <|tool_list_start|>{{ tools | tojson }}<|tool_list_end|>", "lfm2"),
        ("{{ '<|tool_call_start|>' }}[{{ calls }}]<|tool_call_end|>", "lfm2"),
        ("<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>", "qwen3_coder"),  # Qwen3.5 / Next
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),
        (
            "{{ '<|start|>assistant to=' + tc.name + '<|channel|>commentary json<|message|>' }}<|call|>",
            "openai",
        ),
    ],
)
def test_auto_picks_the_format_the_template_writes(template, name):
    assert auto_name(template) == name


def test_unknown_parser_names_list_the_choices():
    assert canonical_name("qwen") == "hermes"
    assert canonical_name("granite4") == "hermes" and canonical_name("nemotron_h") == "nemotron"
    assert canonical_name("qwen3_5") == canonical_name("qwen3_next") == "qwen3_coder"
    assert canonical_name("harmony") == canonical_name("gpt_oss") == "openai"
    with pytest.raises(ValueError, match="choose one of auto, hermes"):
        canonical_name("o200k")


def test_whitespace_beside_calls_is_not_content_but_a_plain_blank_answer_is():
    calls = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n\n'
    with_calls = ToolCallExtractor(make_format("hermes", TOOLS), NAMES)
    streamed = [e for piece in calls for e in with_calls.feed(piece)] + with_calls.finish()
    assert with_calls.content == "" and not [e for e in streamed if isinstance(e, TextDelta)]
    blank = ToolCallExtractor(make_format("hermes", TOOLS), NAMES)
    events = blank.feed(" \n") + blank.finish()
    assert blank.content == " \n" and events == [TextDelta(" \n")]


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("glm45", "<tool_call>get_time\n<arg_key>timezone</arg_key>\nUTC</tool_call>"),
        ("glm45", "<tool_call></tool_call>"),
        (
            "kimi_k2",
            (
                '<|tool_calls_section_begin|><|tool_call_begin|>get_time<|tool_call_argument_begin|>{"a": 1}'
                "<|tool_call_end|><|tool_calls_section_end|>"
            ),
        ),
        (
            "kimi_k2",
            (
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
                '<|tool_call_argument_begin|>{"timezone": }<|tool_call_end|><|tool_calls_section_end|>'
            ),
        ),
        (
            "minimax_m2",
            (
                '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="timezone">UTC\n'
                "</minimax:tool_call>"
            ),
        ),
        ("nemotron", '<TOOLCALL>{"name": "get_time", "arguments": {}}</TOOLCALL>'),
        ("nemotron", '<TOOLCALL>[{"name": "get_time", "arguments": [1]}]</TOOLCALL>'),
        ("lfm2", "<|tool_call_start|>[get_time(timezone=__import__('os').getcwd())]<|tool_call_end|>"),
        ("lfm2", "<|tool_call_start|>[get_time('UTC')]<|tool_call_end|>"),
        ("lfm2", "<|tool_call_start|>[get_time(timezone={1, 2})]<|tool_call_end|>"),
    ],
)
def test_a_malformed_call_stays_content_without_a_crash(parser, text):
    extractor = ToolCallExtractor(make_format(parser, TOOLS), NAMES, stream=False)
    extractor.feed("Here: " + text)
    extractor.finish()
    assert extractor.calls == [] and extractor.content == "Here: " + text
    streamed = ToolCallExtractor(make_format(parser, TOOLS), NAMES)
    for piece in text:  # streamed, a call whose name was out stays a call; nothing raises
        streamed.feed(piece)
    streamed.finish()


ALARM = {
    "name": "set_alarm",
    "parameters": {
        "type": "object",
        "properties": {"hour": {"type": "integer"}, "label": {"type": "string"}, "days": {"type": "array"}},
    },
}


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (
            "glm45",
            (
                "<tool_call>set_alarm\n<arg_key>hour</arg_key>\n<arg_value>7</arg_value>\n<arg_key>label"
                '</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n<arg_value>["mon"]</arg_value>\n'
                "</tool_call>"
            ),
        ),
        (
            "minimax_m2",
            (
                '<minimax:tool_call>\n<invoke name="set_alarm">\n<parameter name="hour">7</parameter>\n'
                '<parameter name="label">42</parameter>\n<parameter name="days">["mon"]</parameter>\n</invoke>\n'
                "</minimax:tool_call>"
            ),
        ),
    ],
)
def test_parameter_values_are_typed_by_the_tool_schema(parser, text):
    for stream in (False, True):
        extractor = ToolCallExtractor(make_format(parser, [ALARM]), {"set_alarm"}, stream=stream)
        for piece in [text] if not stream else text:
            extractor.feed(piece)
        extractor.finish()
        assert [json.loads(c.arguments) for c in extractor.calls] == [
            {"hour": 7, "label": "42", "days": ["mon"]}
        ]
