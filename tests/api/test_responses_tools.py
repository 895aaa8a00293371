"""Responses tool_choice spellings -> the neutral ToolChoice; named tools that are not offered are 400s."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.responses_convert import chat_prompt
from api.responses_schemas import ResponsesRequest
from api.responses_tools import tool_choice


def tool(name: str) -> dict:
    return {"type": "function", "name": name, "parameters": {"type": "object"}}


TOOLS = [tool("get_weather"), tool("get_time")]


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "default", "input": "hi", "tools": TOOLS, **fields})


@pytest.mark.parametrize(
    ("choice", "mode"), [(None, "auto"), ("auto", "auto"), ("none", "none"), ("required", "required")]
)
def test_modes(choice, mode):
    parsed = tool_choice(request(tool_choice=choice))
    assert parsed.mode == mode and parsed.named is None and len(parsed.callable_tools()) == 2


def test_named_function_forces_that_tool_and_parallel_follows_the_request():
    parsed = tool_choice(
        request(tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False)
    )
    assert parsed.mode == "required" and [t["name"] for t in parsed.callable_tools()] == ["get_time"]
    assert parsed.parallel is False and tool_choice(request()).parallel is True


def test_allowed_tools_offers_only_those():
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    parsed = tool_choice(request(tool_choice=choice))
    assert parsed.mode == "required" and [t["name"] for t in parsed.tools] == ["get_time"]
    assert [t["function"]["name"] for t in chat_prompt(request(tool_choice=choice), []).tools] == ["get_time"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tool_choice": "required", "tools": []}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [tool("nope")]}},
            "tool_choice.tools[0]",
        ),
        ({"tool_choice": {"type": "allowed_tools", "mode": "often", "tools": TOOLS}}, "tool_choice.mode"),
    ],
)
def test_bad_choices_are_400s_naming_the_param(fields, param):
    with pytest.raises(ApiError) as err:
        tool_choice(request(**fields))
    assert err.value.status == 400 and err.value.param == param
