"""Each dialect's JSON output format -> StructuredOutputs, and the 400s for malformed ones."""

from __future__ import annotations

import json

from engine.messages import StructuredOutputs

import pytest

from api.errors import ApiError
from api.openai_schemas import ChatCompletionRequest
from api.structured_formats import (
    anthropic_output_format,
    openai_response_format,
    openai_structured,
    responses_text_format,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_openai_formats():
    assert openai_response_format(None) is None
    assert openai_response_format({"type": "text"}) is None
    assert openai_response_format({"type": "json_object"}) == StructuredOutputs(
        json_object=True, param="response_format"
    )
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    assert openai_response_format(fmt) == StructuredOutputs(
        json_schema=SCHEMA, param="response_format.json_schema.schema"
    )
    # OpenAI's schema field is optional: without it any JSON object is produced.
    assert openai_response_format({"type": "json_schema", "json_schema": {"name": "x"}}).json_object


def test_responses_formats_are_flat():
    fmt = {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}
    assert responses_text_format(fmt) == StructuredOutputs(json_schema=SCHEMA, param="text.format.schema")
    assert responses_text_format({"type": "json_object"}) == StructuredOutputs(
        json_object=True, param="text.format"
    )
    assert responses_text_format({"type": "text"}) is None


def test_anthropic_formats_in_either_place():
    fmt = {"type": "json_schema", "schema": SCHEMA}
    assert anthropic_output_format({"format": fmt}, None) == StructuredOutputs(
        json_schema=SCHEMA, param="output_config.format.schema"
    )
    assert anthropic_output_format(None, fmt) == StructuredOutputs(
        json_schema=SCHEMA, param="output_format.schema"
    )
    assert anthropic_output_format({"effort": None}, None) is None
    assert anthropic_output_format(None, None) is None


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: openai_response_format({"type": "json_schema"}), "response_format.json_schema"),
        (
            lambda: openai_response_format({"type": "json_schema", "json_schema": {"schema": 3}}),
            "response_format.json_schema.schema",
        ),
        (lambda: openai_response_format({"type": "regex"}), "response_format"),
        (lambda: openai_response_format({"type": "yaml"}), "response_format.type"),
        (lambda: responses_text_format({"type": "json_schema", "schema": []}), "text.format.schema"),
        (
            lambda: anthropic_output_format({"format": {"type": "json_schema"}}, None),
            "output_config.format.schema",
        ),
        (
            lambda: anthropic_output_format(
                {"format": {"type": "json_schema", "schema": SCHEMA}},
                {"type": "json_schema", "schema": SCHEMA},
            ),
            "output_format",
        ),
        (lambda: anthropic_output_format({"effort": "high"}, None), "output_config.effort"),
        (lambda: anthropic_output_format({"verbosity": 1}, None), "output_config.verbosity"),
    ],
)
def test_malformed_formats_are_400s_naming_the_field(call, param):
    with pytest.raises(ApiError) as err:
        call()
    assert err.value.status == 400 and err.value.param == param


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_vllm_guided_extras():
    expected = StructuredOutputs(json_schema=SCHEMA, param="guided_json")
    assert openai_structured(chat(guided_json=SCHEMA)) == expected
    assert openai_structured(chat(guided_json=json.dumps(SCHEMA))) == expected
    assert openai_structured(chat(guided_regex=r"\d+/x")) == StructuredOutputs(
        grammar=r"start: /\d+\/x/", param="guided_regex"
    )
    assert openai_structured(chat(guided_choice=['say "yes"', "no"])) == StructuredOutputs(
        grammar=r'start: "say \"yes\"" | "no"', param="guided_choice"
    )
    assert openai_structured(chat(response_format={"type": "text"}, guided_choice=["a"])).grammar
    assert openai_structured(chat()) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
    ],
)
def test_conflicting_or_malformed_extras_are_400s(fields, param):
    with pytest.raises(ApiError) as err:
        openai_structured(chat(**fields))
    assert err.value.param == param
