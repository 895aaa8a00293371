"""OpenAI requests -> engine inputs: honoured params map through, unhonoured ones are 400s naming them."""

from __future__ import annotations

from engine.messages import SamplingParams

import pytest

from api.errors import ApiError
from api.openai_convert import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    chat_messages,
    chat_prompt,
    chat_sampling_params,
    check_chat_supported,
    check_completion_supported,
    completion_prompts,
    completion_sampling_params,
    embedding_inputs,
    include_usage,
    resolve_model,
    samples_per_prompt,
    template_kwargs,
)
from api.openai_schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from api.openai_tools import tool_choice

USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "default", "messages": USER, **fields})


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "default", "prompt": "hi", **fields})


def test_defaults_match_openai():
    assert chat_sampling_params(chat()) == SamplingParams(max_tokens=None, temperature=1.0, top_p=1.0)
    assert completion_sampling_params(completion()).max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS


def test_sampling_params_map_through():
    params = chat_sampling_params(
        chat(
            max_completion_tokens=7,
            max_tokens=99,
            temperature=0,
            top_p=0.5,
            top_k=5,
            min_p=0.1,
            seed=3,
            stop="END",
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.2,
            logit_bias={"42": -100},
            min_tokens=2,
            ignore_eos=True,
            stop_token_ids=[9],
            skip_special_tokens=False,
            include_stop_str_in_output=True,
            logprobs=True,
            top_logprobs=3,
        )
    )
    assert params == SamplingParams(
        max_tokens=7,  # max_completion_tokens wins over the deprecated max_tokens
        min_tokens=2,
        temperature=0.0,
        top_p=0.5,
        top_k=5,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={42: -100.0},
        seed=3,
        stop=["END"],
        stop_token_ids=[9],
        include_stop_str_in_output=True,
        ignore_eos=True,
        logprobs=3,
        skip_special_tokens=False,
    )


@pytest.mark.parametrize("top_k", [None, -1, 0])
def test_top_k_off_values(top_k):
    assert chat_sampling_params(chat(top_k=top_k)).top_k is None


def test_chat_logprobs_without_top_is_zero_alternatives():
    assert chat_sampling_params(chat(logprobs=True)).logprobs == 0
    assert chat_sampling_params(chat(logprobs=False)).logprobs is None


def test_completion_logprobs_int():
    assert completion_sampling_params(completion(logprobs=2)).logprobs == 2


@pytest.mark.parametrize(
    ("bias", "message"), [({"x": 1}, "not one"), ({"-3": 1}, "not one"), ({"5": 101}, "[-100, 100]")]
)
def test_bad_logit_bias_is_400(bias, message):
    with pytest.raises(ApiError) as err:
        chat_sampling_params(chat(logit_bias=bias))
    assert err.value.status == 400 and err.value.param == "logit_bias" and message in err.value.message


def test_empty_stop_string_is_400():
    with pytest.raises(ApiError) as err:
        chat_sampling_params(chat(stop=["ok", ""]))
    assert err.value.param == "stop"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 17}, "n"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"function_call": "auto"}, "function_call"),
        (
            {"chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs.add_generation_prompt",
        ),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_unhonoured_chat_params_are_400_naming_the_param(fields, param):
    """The fields docs/compatibility.md rejects (its no-ops are checked by test_compatibility_doc.py)."""
    with pytest.raises(ApiError) as err:
        check_chat_supported(chat(**fields))
    assert err.value.status == 400 and err.value.param == param
    assert err.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1},
        {"n": 16},
        {"tool_choice": "none"},
        {"response_format": {"type": "text"}},
        {"response_format": {"type": "json_object"}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            }
        },
        {"modalities": ["text"]},
        {"service_tier": "auto"},
        {"store": False},
        {"user": "u", "metadata": {"a": "b"}, "parallel_tool_calls": False},
        {"stream": True, "stream_options": {"include_usage": True}},
    ],
)
def test_harmless_chat_params_pass(fields):
    check_chat_supported(chat(**fields))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 2}, "best_of"),
        ({"best_of": 3, "n": 2}, "best_of"),
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"n": 17}, "n"),
    ],
)
def test_unhonoured_completion_params_are_400(fields, param):
    with pytest.raises(ApiError) as err:
        check_completion_supported(completion(**fields))
    assert err.value.param == param and err.value.code == "unsupported_parameter"


@pytest.mark.parametrize("fields", [{"n": 3}, {"n": 2, "best_of": 2}, {"best_of": 1}])
def test_n_and_an_equal_best_of_pass_for_completions(fields):
    check_completion_supported(completion(**fields))
    assert samples_per_prompt(completion(**fields)) == fields.get("n", 1)


def test_chat_messages_flatten_parts_and_rename_developer():
    req = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    )
    assert chat_messages(req) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]), ([[1], [2, 3]], [[1], [2, 3]])],
)
def test_completion_prompts(prompt, expected):
    assert completion_prompts(completion(prompt=prompt)) == expected


@pytest.mark.parametrize(("prompt", "param"), [([], "prompt"), ([[1], []], "prompt[1]")])
def test_empty_prompts_are_400(prompt, param):
    with pytest.raises(ApiError) as err:
        completion_prompts(completion(prompt=prompt))
    assert err.value.param == param


def test_embedding_inputs():
    assert embedding_inputs(EmbeddingRequest(model="m", input="a")) == ["a"]
    assert embedding_inputs(EmbeddingRequest(model="m", input=[5, 6])) == [[5, 6]]
    assert embedding_inputs(EmbeddingRequest(model="m", input=["a", "b"])) == ["a", "b"]


def test_resolve_model_accepts_default_own_name_and_alias():
    for name in ("default", "SmolLM2", "smol"):
        assert resolve_model(name, "SmolLM2", "smol") == "smol"
    assert resolve_model("default", "SmolLM2", None) == "SmolLM2"


def test_unknown_model_is_404_model_not_found():
    with pytest.raises(ApiError) as err:
        resolve_model("gpt-4", "SmolLM2", "smol")
    body = err.value.body()["error"]
    assert err.value.status == 404 and body["code"] == "model_not_found" and body["param"] == "model"
    assert "gpt-4" in body["message"]


def test_include_usage_only_when_streaming():
    assert include_usage(chat(stream=True, stream_options={"include_usage": True}))
    assert not include_usage(chat(stream=True))


def test_chat_prompt_keeps_add_generation_prompt_tools_and_images():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    }  # fmt: skip
    req = ChatCompletionRequest.model_validate(body)
    prompt = chat_prompt(req, tool_choice(req.tools, req.tool_choice, req.parallel_tool_calls))
    assert prompt.add_generation_prompt and prompt.image_urls == ("https://example.com/a.png",)
    assert [tool["function"]["name"] for tool in prompt.tools or []] == ["f"]
    unopened = ChatCompletionRequest.model_validate(body | {"add_generation_prompt": False})
    prompt = chat_prompt(unopened, tool_choice(None, None, None))
    assert not prompt.add_generation_prompt and not prompt.continue_final_message


def test_template_kwargs_carry_chat_template_kwargs_and_reasoning_effort():
    req = chat(chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low")
    assert template_kwargs(req) == {"enable_thinking": False, "reasoning_effort": "low"}
    explicit = chat(chat_template_kwargs={"reasoning_effort": "high"}, reasoning_effort="low")
    assert template_kwargs(explicit) == {"reasoning_effort": "high"}  # the explicit variable wins
