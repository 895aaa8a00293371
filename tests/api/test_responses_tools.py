"""Responses tool_choice spellings -> the neutral ToolChoice; namespace tools flattened and named back;
named tools that are not offered, and forced hosted tools, are 400s."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.responses_convert import chat_prompt
from api.responses_schemas import ResponsesRequest
from api.responses_tools import tool_choice, tool_names


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
        ({"tool_choice": {"type": "custom", "name": "apply_patch"}}, "tool_choice"),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "web_search"}]}},
            "tool_choice.tools",
        ),
        ({"tools": [*TOOLS, tool("get_time")]}, "tools"),
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


NAMESPACE = {"type": "namespace", "name": "crm", "tools": [tool("find"), tool("get_time")]}


def namespaced(**fields) -> ResponsesRequest:
    return request(tools=[*TOOLS, NAMESPACE, {"type": "web_search"}], **fields)


def test_namespace_members_are_offered_flattened_and_named_back():
    parsed = tool_choice(namespaced())
    assert [t["name"] for t in parsed.tools] == ["get_weather", "get_time", "crm__find", "crm__get_time"]
    names = tool_names(namespaced())
    assert names.original("crm__find") == ("crm", "find") and names.original("get_time") == (None, "get_time")


@pytest.mark.parametrize(
    ("choice", "forced"),
    [
        ({"type": "function", "name": "find", "namespace": "crm"}, "crm__find"),
        ({"type": "function", "name": "crm__find"}, "crm__find"),
        ({"type": "function", "name": "find"}, "crm__find"),  # the one member of that name
        ({"type": "function", "name": "get_time"}, "get_time"),  # a top-level tool wins
        ({"type": "function", "name": "get_time", "namespace": "crm"}, "crm__get_time"),
    ],
)
def test_a_named_choice_finds_namespace_members(choice, forced):
    parsed = tool_choice(namespaced(tool_choice=choice))
    assert parsed.mode == "required" and [t["name"] for t in parsed.callable_tools()] == [forced]


def test_allowed_tools_skip_hosted_entries_and_find_namespace_members():
    entries = [{"type": "web_search"}, {"type": "function", "name": "find", "namespace": "crm"}]
    parsed = tool_choice(namespaced(tool_choice={"type": "allowed_tools", "mode": "auto", "tools": entries}))
    assert [t["name"] for t in parsed.tools] == ["crm__find"]


@pytest.mark.parametrize("hosted", ["web_search_preview", "file_search", "mcp", "image_generation"])
def test_forcing_a_hosted_tool_is_a_400_that_says_so(hosted):
    with pytest.raises(ApiError) as err:
        tool_choice(namespaced(tool_choice={"type": hosted}))
    assert err.value.status == 400 and err.value.param == "tool_choice" and "hosted" in err.value.message
