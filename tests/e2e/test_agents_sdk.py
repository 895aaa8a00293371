"""The OpenAI Agents SDK (`openai-agents`) running agents against the real app: through the Responses API
(its default model class) and through Chat Completions, each with one function tool.

The bundled SmolLM2 calls the tool because `tool_choice="required"` is enforced by grammar; its free
answers are not meaningful, so the tests check structure: the tool ran with a city, the run finished.
"""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

pytestmark = pytest.mark.e2e

WEATHER = "Sunny, 21 C"


def weather_agent(model, calls: list[str], **settings) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return WEATHER

    return Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=48
        ),
        **settings,
    )


def run(agent: Agent, max_turns: int = 3):
    set_tracing_disabled(True)
    return asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=max_turns))


def model(base_url: str, kind: str):
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    if kind == "responses":
        return OpenAIResponsesModel(model="default", openai_client=client)
    return OpenAIChatCompletionsModel(model="default", openai_client=client)


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_agent_calls_the_tool_and_stops_on_its_result(base_url, kind):
    calls: list[str] = []
    result = run(weather_agent(model(base_url, kind), calls, tool_use_behavior="stop_on_first_tool"))
    assert len(calls) == 1 and calls[0].strip()
    assert result.final_output == WEATHER
    kinds = [type(item) for item in result.new_items]
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_agent_sends_the_tool_result_back_and_finishes(base_url, kind):
    """The default loop: after the call, tool_choice resets to auto and the tool's output goes back to
    the model (as input items resent by the SDK), which answers in text."""
    calls: list[str] = []
    result = run(weather_agent(model(base_url, kind), calls))
    assert len(calls) >= 1 and all(city.strip() for city in calls)
    assert isinstance(result.final_output, str)
    assert len(result.raw_responses) >= 2
