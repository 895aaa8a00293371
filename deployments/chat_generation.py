"""The steps the Anthropic and Responses routes share: render a `ChatPrompt` with the Tokenizer, then run
one engine request through a `Generation`. Holds deployment handles only; converts nothing to JSON.
"""

from __future__ import annotations

from contextlib import aclosing

from engine.errors import EngineError
from engine.messages import GenerateRequest

from ray.serve.handle import DeploymentHandle

from api.choice_state import ChoiceState
from api.errors import from_engine_error
from api.template_messages import ChatPrompt
from deployments.generation import Generation


async def prompt_ids(tokenizer: DeploymentHandle, prompt: ChatPrompt, prompt_param: str) -> list[int]:
    """The rendered prompt's token ids; a prompt the template refuses is a 400 blaming `prompt_param`."""
    ids = await tokenizer.chat_prompt_ids.remote(
        prompt.messages, prompt.add_generation_prompt, prompt.tools, prompt.continue_final_message
    )
    if isinstance(ids, EngineError):
        if ids.param == "messages":  # the Tokenizer names chat completions' field; this route's may differ
            ids.param = prompt_param
        raise from_engine_error(ids, prompt_param)
    return ids


async def start(
    scheduler: DeploymentHandle, request: GenerateRequest, prompt_param: str
) -> tuple[Generation, ChoiceState]:
    """Starts the request; a rejected one raises its ApiError before any byte goes out."""
    generation = Generation(scheduler, [request], prompt_param)
    await generation.start()
    return generation, ChoiceState(0, num_prompt_tokens=len(request.prompt_token_ids))


async def collect(generation: Generation, state: ChoiceState) -> None:
    async with aclosing(generation.batches()) as batches:
        async for _, batch in batches:
            state.add(batch)
