"""Golden outputs per tool-call format: text as a model of that family writes it (per its chat template
and model card), with the content and calls it must parse into."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Golden:
    parser: str
    text: str
    content: str
    calls: list[tuple[str, dict]] = field(default_factory=list)


WEATHER = {"city": "Paris", "unit": "celsius"}
TIME = {"timezone": "Europe/Paris"}

GOLDENS = [
    Golden(
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "Let me check.\n",
        [("get_weather", WEATHER)],
    ),
    Golden(
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>',
        "",  # the newline between the calls is not content
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris {\\"quoted\\"}", "unit": "celsius"}}\n</tool_call>',
        "",
        [("get_weather", {"city": 'Paris {"quoted"}', "unit": "celsius"})],
    ),
    Golden("hermes", "No tools needed: 2 < 3 and <b>bold</b>.", "No tools needed: 2 < 3 and <b>bold</b>."),
    Golden(
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", WEATHER)],
    ),
    Golden(
        "qwen3_coder",
        "Sure.\n<tool_call>\n<function=get_time>\n<parameter=timezone>\nEurope/Paris\n</parameter>\n"
        "</function>\n</tool_call>",
        "Sure.\n",
        [("get_time", TIME)],
    ),
    Golden(
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
    ),
    Golden(
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
        '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
        "",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden("llama3_json", "The weather {in Paris} is mild.", "The weather {in Paris} is mild."),
    Golden(
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]',
        "",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "mistral",
        'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}',
        "Checking.",
        [("get_weather", WEATHER)],
    ),
    Golden(
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]get_time[ARGS]{"timezone": "Europe/Paris"}',
        "",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris", "unit": "celsius"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        [("get_weather", WEATHER)],
    ),
    Golden(
        "deepseek",
        "I will call two tools.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "unit": "celsius"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>'
        '{"timezone": "Europe/Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "I will call two tools.",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "glm45",
        "Let me check both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>\n"
        "<tool_call>get_time\n<arg_key>timezone</arg_key>\n<arg_value>Europe/Paris</arg_value>\n</tool_call>\nDone.",
        "Let me check both.\n\n\nDone.",  # after content, the newline between calls is content too
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(  # GLM-4.7 writes no newlines
        "glm45",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>",
        "",
        [("get_weather", WEATHER)],
    ),
    Golden(
        "kimi_k2",
        "Let me check both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "unit": "celsius"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>"
        '{"timezone": "Europe/Paris"}<|tool_call_end|><|tool_calls_section_end|> Done.',
        "Let me check both. Done.",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "minimax_m2",
        'Let me check both.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Paris</parameter>\n<parameter name="unit">celsius</parameter>\n</invoke>\n'
        '<invoke name="get_time">\n<parameter name="timezone">Europe/Paris</parameter>\n</invoke>\n'
        "</minimax:tool_call>\nDone.",
        "Let me check both.\n\nDone.",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "nemotron",
        'Let me check both.\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]</TOOLCALL>\nDone.',
        "Let me check both.\n\nDone.",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "lfm2",
        'Let me check both.<|tool_call_start|>[get_weather(city="Paris", unit="celsius"), '
        "get_time(timezone='Europe/Paris')]<|tool_call_end|>Done.",
        "Let me check both.Done.",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "lfm2",
        '<|tool_call_start|>[get_weather(city="Paris (\\"centre\\"), 1er", unit="celsius")]<|tool_call_end|>',
        "",
        [("get_weather", {"city": 'Paris ("centre"), 1er', "unit": "celsius"})],
    ),
    # The openai format reads the answer api/harmony.py hands it: calls in canonical regions (or raw).
    Golden(
        "openai",
        'Checking.<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris", "unit": "celsius"}'
        '<|call|><|channel|>commentary to=functions.get_time<|message|>{"timezone": "Europe/Paris"}<|call|>',
        "Checking.",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Golden(
        "openai",
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
        '{"timezone": "Europe/Paris"}<|call|>',
        "",
        [("get_time", TIME)],
    ),
]

TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
    {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
]
