"""Forced-call grammars, checked with llguidance itself on the bundled model's tokenizer: each accepts a
valid call in its format (which the format's parser reads back) and rejects wrong names and arguments."""

from __future__ import annotations

import json

from engine.messages import SamplingParams

import pytest

from api.output_parser import OutputParsing, parse_whole
from api.tool_choice import ToolChoice, apply, output_parsing
from api.tool_parsers import make_format
from tests.api.tool_goldens import TOOLS

llguidance = pytest.importorskip("llguidance")

WEATHER = '{"city": "Paris", "unit": "celsius"}'
TIME = '{"timezone": "UTC"}'
DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
QC = "<tool_call>\n<function={}>\n{}</function>\n</tool_call>"
QC_WEATHER = "<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
GLM = "<tool_call>{}\n{}</tool_call>"
GLM_PAIR = "<arg_key>{}</arg_key>\n<arg_value>{}</arg_value>\n"
KIMI_CALL = "<|tool_call_begin|>functions.{}:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
MM_CALL = '<invoke name="{}">\n{}</invoke>\n'
MM_PARAMETER = '<parameter name="{}">{}</parameter>\n'
HARMONY_CALL = "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}<|call|>"
CALLS = {  # parser -> (weather call, time call, joiner of parallel calls)
    "hermes": (
        f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
        f'<tool_call>\n{{"name": "get_time", "arguments": {TIME}}}\n</tool_call>',
        "\n",
    ),
    "qwen3_coder": (
        QC.format("get_weather", QC_WEATHER),
        QC.format("get_time", "<parameter=timezone>\nUTC\n</parameter>\n"),
        "\n",
    ),
    "llama3_json": (
        f'{{"name": "get_weather", "parameters": {WEATHER}}}',
        f'{{"name": "get_time", "parameters": {TIME}}}',
        "; ",
    ),
    "mistral": (f"[TOOL_CALLS]get_weather[ARGS]{WEATHER}", f"[TOOL_CALLS]get_time[ARGS]{TIME}", ""),
    "deepseek": (DS_CALL.format("get_weather", WEATHER), DS_CALL.format("get_time", TIME), ""),
    "glm45": (
        GLM.format("get_weather", GLM_PAIR.format("city", "Paris") + GLM_PAIR.format("unit", "celsius")),
        GLM.format("get_time", GLM_PAIR.format("timezone", "UTC")),
        "\n",
    ),
    "kimi_k2": (KIMI_CALL.format("get_weather", WEATHER), KIMI_CALL.format("get_time", TIME), ""),
    "minimax_m2": (
        MM_CALL.format(
            "get_weather", MM_PARAMETER.format("city", "Paris") + MM_PARAMETER.format("unit", "celsius")
        ),
        MM_CALL.format("get_time", MM_PARAMETER.format("timezone", "UTC")),
        "",
    ),
    "nemotron": (
        f'{{"name": "get_weather", "arguments": {WEATHER}}}',
        f'{{"name": "get_time", "arguments": {TIME}}}',
        ", ",
    ),
    "lfm2": ('get_weather(city="Paris", unit="celsius")', 'get_time(timezone="UTC")', ", "),
    "openai": (
        HARMONY_CALL.format("get_weather", WEATHER),
        HARMONY_CALL.format("get_time", TIME),
        "<|start|>assistant",
    ),
}
SECTIONS = {  # parser -> the tags around all of an output's calls
    "deepseek": "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
    "kimi_k2": "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>",
    "minimax_m2": "<minimax:tool_call>\n{}</minimax:tool_call>",
    "nemotron": "<TOOLCALL>[{}]</TOOLCALL>",
    "lfm2": "<|tool_call_start|>[{}]<|tool_call_end|>",
}


def _whole(parser: str, calls: str) -> str:
    return SECTIONS.get(parser, "{}").format(calls)


@pytest.fixture(scope="module")
def tokenizer():
    from engine.models.default_model import ensure_default_model

    import llguidance.hf
    import transformers

    return llguidance.hf.from_tokenizer(
        transformers.AutoTokenizer.from_pretrained(ensure_default_model("float32"))
    )


def _accepts(tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("lark", grammar), log_level=0)
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def _parsed_names(parser: str, text: str) -> list[str]:
    parsed = parse_whole(OutputParsing(make_format(parser, TOOLS)), text)  # with the format's framing
    assert parsed.content.strip() == ""
    return [call.name for call in parsed.calls if json.loads(call.arguments) is not None]


@pytest.mark.parametrize("parser", CALLS)
def test_grammar_accepts_one_valid_call_that_parses_back(tokenizer, parser):
    weather, time, _ = CALLS[parser]
    grammar = make_format(parser, TOOLS).grammar(TOOLS, parallel=False)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar)) == ""
    for text, name in ((weather, "get_weather"), (time, "get_time")):
        assert _accepts(tokenizer, grammar, _whole(parser, text))
        assert _parsed_names(parser, _whole(parser, text)) == [name]


@pytest.mark.parametrize("parser", CALLS)
def test_grammar_for_one_named_tool_rejects_the_other(tokenizer, parser):
    weather, time, _ = CALLS[parser]
    grammar = make_format(parser, TOOLS).grammar(TOOLS[1:], parallel=False)
    assert _accepts(tokenizer, grammar, _whole(parser, time))
    assert not _accepts(tokenizer, grammar, _whole(parser, weather))


@pytest.mark.parametrize("parser", CALLS)
def test_parallel_calls_only_when_allowed(tokenizer, parser):
    weather, time, joiner = CALLS[parser]
    both = _whole(parser, weather + joiner + time)
    assert _accepts(tokenizer, make_format(parser, TOOLS).grammar(TOOLS, parallel=True), both)
    assert not _accepts(tokenizer, make_format(parser, TOOLS).grammar(TOOLS, parallel=False), both)
    assert _parsed_names(parser, both) == ["get_weather", "get_time"]


@pytest.mark.parametrize("parser", CALLS)
def test_a_named_choice_forces_exactly_one_call_even_with_parallel_calls_allowed(tokenizer, parser):
    # A small model forced to a named tool by a grammar that allows more calls repeats the same call.
    _, time, joiner = CALLS[parser]
    choice = ToolChoice(TOOLS, "required", named="get_time", parallel=True)
    params = SamplingParams()
    apply(choice, output_parsing(choice, parser, None), params, "tool_choice")
    assert params.structured is not None and params.structured.grammar is not None
    assert _accepts(tokenizer, params.structured.grammar, _whole(parser, time))
    assert not _accepts(tokenizer, params.structured.grammar, _whole(parser, time + joiner + time))


@pytest.mark.parametrize("parser", CALLS)
def test_grammar_rejects_schema_invalid_arguments_and_plain_text(tokenizer, parser):
    weather, _, _ = CALLS[parser]
    grammar = make_format(parser, TOOLS).grammar(TOOLS, parallel=True)
    bad_unit = weather.replace("celsius", "kelvin")
    assert not _accepts(tokenizer, grammar, _whole(parser, bad_unit))
    assert not _accepts(tokenizer, grammar, "The weather in Paris is sunny.")
    assert not _accepts(tokenizer, grammar, _whole(parser, weather.replace("get_weather", "get_wether")))
