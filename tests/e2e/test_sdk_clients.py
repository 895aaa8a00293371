"""Third-party SDKs against the real app: LangChain (ChatOpenAI, ChatAnthropic), LiteLLM (its OpenAI and
Anthropic routes) and pydantic-ai (Chat Completions and Responses models). The OpenAI Agents SDK has its own
file, tests/e2e/test_agents_sdk.py.

SmolLM2-135M's answers mean nothing, so these tests check what the protocols promise: text comes back, a
stream adds up to the text of the same request made whole (greedy decoding), a forced tool is called with
arguments that fit its schema and no tool-call markup is left in the text, a schema-shaped answer parses.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput, ToolOutput
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
HELLO = "Say hello."
ASK_WEATHER = "What is the weather in Paris?"
ASK_CITY = "Name a city and its population."
TEXT_MAX_TOKENS = 16
# A forced call of either schema below takes about 30 tokens of the model's <tool_call> markup.
CALL_MAX_TOKENS = 64
# Cuts the forced call inside its arguments.
CUT_CALL_MAX_TOKENS = 14


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str


class City(BaseModel):
    name: str
    population: int


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "GetWeather",
        "description": GetWeather.__doc__,
        "parameters": GetWeather.model_json_schema(),
    },
}
FORCE_WEATHER = {"type": "function", "function": {"name": "GetWeather"}}


# LangChain


def langchain_model(base_url: str, dialect: str, max_tokens: int) -> BaseChatModel:
    common = {"model": MODEL, "api_key": "unused", "temperature": 0, "max_retries": 0, "timeout": 120}
    if dialect == "openai":
        return ChatOpenAI(base_url=f"{base_url}/v1", max_tokens=max_tokens, **common)
    return ChatAnthropic(base_url=base_url, max_tokens=max_tokens, **common)


def invoke_or_stream(runnable, prompt: str, stream: bool) -> AIMessage:
    if not stream:
        return runnable.invoke(prompt)
    chunks = list(runnable.stream(prompt))
    assert len(chunks) > 1
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    return whole


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_langchain_invoke_and_stream_agree(base_url, dialect):
    model = langchain_model(base_url, dialect, TEXT_MAX_TOKENS)
    text = model.invoke(HELLO).text
    assert text.strip()
    chunks = list(model.stream(HELLO))
    assert sum(1 for chunk in chunks if chunk.text) > 1
    assert "".join(chunk.text for chunk in chunks) == text


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_langchain_forced_tool_is_called_once(base_url, dialect, stream):
    model = langchain_model(base_url, dialect, CALL_MAX_TOKENS)
    bound = model.bind_tools([GetWeather], tool_choice="GetWeather", parallel_tool_calls=False)
    message = invoke_or_stream(bound, ASK_WEATHER, stream)
    assert [call["name"] for call in message.tool_calls] == ["GetWeather"], message
    GetWeather.model_validate(message.tool_calls[0]["args"])
    assert message.invalid_tool_calls == []
    assert not message.text.strip(), message.text


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_langchain_forced_call_cut_by_max_tokens_leaves_no_markup(base_url, dialect):
    """LangChain's default bind_tools (parallel calls allowed). A call that max_tokens cuts is no text:
    whole and streamed responses both return it as a call (arguments cut short) or drop it."""
    model = langchain_model(base_url, dialect, CUT_CALL_MAX_TOKENS)
    bound = model.bind_tools([GetWeather], tool_choice="GetWeather")
    whole = bound.invoke(ASK_WEATHER)
    metadata = whole.response_metadata
    assert metadata.get("finish_reason", metadata.get("stop_reason")) in {"length", "max_tokens"}
    streamed = invoke_or_stream(bound, ASK_WEATHER, stream=True)
    for message in (whole, streamed):
        assert not message.text.strip(), message.text
        assert {call["name"] for call in message.tool_calls + message.invalid_tool_calls} <= {"GetWeather"}
    assert [call["name"] for call in streamed.tool_calls] == [call["name"] for call in whole.tool_calls]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_langchain_structured_output_parses(base_url, dialect, method):
    """json_schema sends response_format (OpenAI) or output_config.format (Anthropic), both enforced by
    grammar; function_calling forces a tool named after the schema. Each is one client's default."""
    model = langchain_model(base_url, dialect, CALL_MAX_TOKENS)
    result = model.with_structured_output(City, method=method, include_raw=True).invoke(ASK_CITY)
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], City)


# LiteLLM


@pytest.fixture(scope="module")
def litellm():
    """LiteLLM offline: its cost map and Anthropic beta-header list come from the wheel, not GitHub.
    (1.110 has no client telemetry to turn off: it sends some only from its proxy, and only when asked.)"""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        patch.setenv("LITELLM_OFFLINE_MODE", "true")
        import litellm

        patch.setattr(litellm, "suppress_debug_info", True)
        yield litellm


def litellm_args(base_url: str, route: str, max_tokens: int) -> dict:
    if route == "openai":
        where = {"model": f"openai/{MODEL}", "api_base": f"{base_url}/v1"}
    else:
        where = {"model": f"anthropic/{MODEL}", "api_base": base_url}
    return where | {"api_key": "unused", "max_tokens": max_tokens, "temperature": 0, "num_retries": 0}


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_completion_and_stream_agree(base_url, litellm, route):
    args = litellm_args(base_url, route, TEXT_MAX_TOKENS)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": HELLO}]
    whole = litellm.completion(messages=messages, **args).choices[0]
    assert whole.message.content.strip()
    chunks = list(litellm.completion(messages=messages, stream=True, **args))
    deltas = [chunk.choices[0].delta.content or "" for chunk in chunks]
    assert sum(1 for delta in deltas if delta) > 1
    assert "".join(deltas) == whole.message.content
    finish_reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices[0].finish_reason]
    assert finish_reasons == [whole.finish_reason]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_forced_tool_is_called_once(base_url, litellm, route, stream):
    messages = [{"role": "user", "content": ASK_WEATHER}]
    request = litellm_args(base_url, route, CALL_MAX_TOKENS) | {
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "tool_choice": FORCE_WEATHER,
        "parallel_tool_calls": False,
    }
    if stream:
        response = litellm.stream_chunk_builder(list(litellm.completion(stream=True, **request)), messages)
    else:
        response = litellm.completion(**request)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [call.function.name for call in choice.message.tool_calls] == ["GetWeather"]
    GetWeather.model_validate_json(choice.message.tool_calls[0].function.arguments)
    assert not (choice.message.content or "").strip()


# pydantic-ai


def pydantic_ai_agent(base_url: str, kind: str, output_type, max_tokens: int) -> Agent:
    provider = OpenAIProvider(base_url=f"{base_url}/v1", api_key="unused")
    model_class = OpenAIResponsesModel if kind == "responses" else OpenAIChatModel
    return Agent(
        model_class(MODEL, provider=provider),
        output_type=output_type,
        instructions="Be brief.",
        model_settings={"max_tokens": max_tokens, "temperature": 0},
        retries=0,
    )


async def stream_text(agent: Agent, prompt: str) -> tuple[list[str], str]:
    async with agent.run_stream(prompt) as run:
        deltas = [delta async for delta in run.stream_text(delta=True)]
        return deltas, await run.get_output()


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_pydantic_ai_text_run_and_stream_agree(base_url, kind):
    agent = pydantic_ai_agent(base_url, kind, str, TEXT_MAX_TOKENS)
    text = agent.run_sync(HELLO).output
    assert isinstance(text, str) and text.strip()
    deltas, streamed = asyncio.run(stream_text(agent, HELLO))
    assert len(deltas) > 1
    assert "".join(deltas) == streamed == text


@pytest.mark.parametrize(
    "output_type",
    [ToolOutput(City), NativeOutput(City)],
    ids=["tool", "native"],  # a forced final_result call; response_format / text.format json_schema
)
@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_pydantic_ai_structured_output_parses(base_url, kind, output_type):
    result = pydantic_ai_agent(base_url, kind, output_type, CALL_MAX_TOKENS).run_sync(ASK_CITY)
    assert isinstance(result.output, City)
