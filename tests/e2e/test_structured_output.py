"""Structured output through the real app and the official SDKs: OpenAI response_format (chat,
completions, Responses text.format), Anthropic output_config.format, streamed and not; logprobs shapes."""

from __future__ import annotations

import json
import math
import re

import anthropic
import jsonschema
import openai
import pydantic
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMAS = {
    "person": PERSON,
    "enum_array": {
        "type": "object",
        "properties": {
            "mood": {"enum": ["happy", "sad", "calm"]},
            "colors": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        },
        "required": ["mood", "colors"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "owner": PERSON,
            "pets": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"enum": ["cat", "dog"]},
                        "legs": {"type": "integer", "maximum": 4},
                    },
                    "required": ["kind", "legs"],
                    "additionalProperties": False,
                },
                "maxItems": 2,
            },
        },
        "required": ["owner", "pets"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "Describe a person and their pets as JSON."}]
GREEDY = {"temperature": 0, "max_tokens": 200}


class Person(pydantic.BaseModel):
    name: str
    age: int


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def chat(client, schema: dict, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=response_format(schema), **{**GREEDY, **kwargs}
    )


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_chat_json_schema_validates(client, name):
    choice = chat(client, SCHEMAS[name]).choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_chat_json_schema_streams_a_valid_document(client, name):
    chunks = list(chat(client, SCHEMAS[name], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_chat_json_schema_at_temperature_1_validates(client):
    for seed in range(3):
        content = chat(client, PERSON, temperature=1.0, seed=seed).choices[0].message.content
        jsonschema.validate(json.loads(content), PERSON)


def test_chat_json_object_is_a_json_object(client):
    messages = [{"role": "user", "content": 'Give a JSON object with keys "name" and "age" for a person.'}]
    response = client.chat.completions.create(
        model=MODEL, messages=messages, response_format={"type": "json_object"}, **GREEDY
    )
    assert isinstance(json.loads(response.choices[0].message.content), dict)


def test_sdk_parse_fills_a_pydantic_model(client):
    response = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, **GREEDY)
    assert isinstance(response.choices[0].message.parsed, Person)


def test_completions_take_a_response_format(client):
    body = {"response_format": response_format(PERSON)}
    response = client.completions.create(model=MODEL, prompt="A person as JSON:", extra_body=body, **GREEDY)
    jsonschema.validate(json.loads(response.choices[0].text), PERSON)
    stream = client.completions.create(
        model=MODEL, prompt="A person as JSON:", extra_body=body, stream=True, **GREEDY
    )
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in stream if c.choices)), PERSON)


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"guided_json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) is None),
        (
            {"guided_regex": r"[0-9]{3}-[A-Z]{2}"},
            lambda text: re.fullmatch(r"[0-9]{3}-[A-Z]{2}", text) is not None,
        ),
        ({"guided_choice": ["red", "green", "blue"]}, lambda text: text in ("red", "green", "blue")),
    ],
    ids=["guided_json", "guided_regex", "guided_choice"],
)
def test_vllm_guided_extras(client, extra, check):
    response = client.chat.completions.create(model=MODEL, messages=ASK, extra_body=extra, **GREEDY)
    assert response.choices[0].finish_reason == "stop"
    assert check(response.choices[0].message.content)


def test_a_regex_the_model_cannot_write_is_a_400_and_the_server_goes_on(client):
    # U+61DB8 needs the UTF-8 lead byte 0xF1, which no SmolLM2 token holds.
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model=MODEL, prompt="5", max_tokens=8, extra_body={"guided_regex": "\U00061db8"}
        )
    assert err.value.body["param"] == "guided_regex" and "0xF1" in err.value.body["message"]
    ok = client.completions.create(model=MODEL, prompt="5", max_tokens=8, extra_body={"guided_regex": "ab"})
    assert ok.choices[0].text == "ab"


def test_responses_text_format_json_schema(client):
    response = client.responses.create(
        model=MODEL,
        input=ASK[0]["content"],
        temperature=0,
        max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
    )
    jsonschema.validate(json.loads(response.output_text), PERSON)


@pytest.mark.parametrize(
    "fmt, param",
    [
        (response_format({"type": "objekt"}), "response_format.json_schema.schema"),  # found by the engine
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "xml"}, "response_format.type"),
    ],
)
def test_a_bad_response_format_is_a_400_naming_it(client, fmt, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, max_tokens=5)
    assert err.value.body["param"] == param


# ---- Anthropic ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def claude_json(claude, schema: dict, **kwargs) -> dict:
    return {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 200,
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
        "extra_body": {"temperature": 0},
        **kwargs,
    }


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_anthropic_output_format_validates(claude, name):
    message = claude.messages.create(**claude_json(claude, SCHEMAS[name]))
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), SCHEMAS[name])


def test_anthropic_output_format_streams(claude):
    with claude.messages.stream(**claude_json(claude, SCHEMAS["nested"])) as stream:
        text = "".join(stream.text_stream)
    jsonschema.validate(json.loads(text), SCHEMAS["nested"])


def test_anthropic_parse_fills_a_pydantic_model(claude):
    message = claude.messages.parse(
        model=MODEL, messages=ASK, max_tokens=200, output_format=Person, extra_body={"temperature": 0}
    )
    assert isinstance(message.parsed_output, Person)


def test_a_bad_responses_schema_is_a_400_naming_text_format(client):
    # The schema is well-formed JSON; only the engine's grammar compiler finds it invalid.
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}, "strict": True}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=5, text={"format": fmt})
    assert err.value.body["param"] == "text.format.schema"


def test_anthropic_bad_schema_is_a_400(claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(**claude_json(claude, {"type": "objekt"}))


# ---- logprobs: one entry per token, k alternatives, a distribution's mass -------------------------


def check_entries(sampled: list[float], tops: list[list[float]], k: int, chosen_is_top: list[bool]) -> None:
    assert len(sampled) == len(tops) > 0
    for logprob, top, is_top in zip(sampled, tops, chosen_is_top):
        assert logprob <= 0 and len(top) == k and all(lp <= 0 for lp in top)
        assert is_top and math.isclose(top[0], logprob, abs_tol=1e-5)  # greedy: the sampled one is the best
        assert sum(math.exp(lp) for lp in top) <= 1 + 1e-4


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "json_schema"])
def test_chat_logprobs_shapes(client, constrained):
    fmt = {"response_format": response_format(PERSON)} if constrained else {}
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=30, logprobs=True, top_logprobs=3, **fmt
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert "".join(e.token for e in content) == response.choices[0].message.content
    check_entries(
        [e.logprob for e in content],
        [[t.logprob for t in e.top_logprobs] for e in content],
        3,
        [e.top_logprobs[0].token == e.token for e in content],
    )


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "json_schema"])
def test_completions_logprobs_shapes(client, constrained):
    body = {"response_format": response_format(PERSON)} if constrained else {}
    response = client.completions.create(
        model=MODEL, prompt="A person as JSON:", temperature=0, max_tokens=30, logprobs=2, extra_body=body
    )
    choice = response.choices[0]
    lp = choice.logprobs
    assert (
        len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == response.usage.completion_tokens
    )
    assert "".join(lp.tokens) == choice.text
    # top_logprobs is a {token text: logprob} map, so k entries unless two tokens share a text.
    tops = [sorted(top.values(), reverse=True) for top in lp.top_logprobs]
    assert all(1 <= len(top) <= 2 for top in tops)
    for logprob, top, token, top_map in zip(lp.token_logprobs, tops, lp.tokens, lp.top_logprobs):
        assert logprob <= 0 and math.isclose(top[0], logprob, abs_tol=1e-5)
        assert math.isclose(top_map[token], logprob, abs_tol=1e-5)
        assert sum(math.exp(v) for v in top) <= 1 + 1e-4
