"""The steps the Anthropic and Responses routes share: render a `ChatPrompt` with the Tokenizer, then run
one engine request through a `Generation`. Holds deployment handles only; converts nothing to JSON.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing

from engine.errors import EngineError
from engine.messages import GenerateRequest, ImageInputs

from api.choice_state import ChoiceState
from api.config import ImageLimitsConfig
from api.errors import from_engine_error, invalid
from api.images import load_images
from api.template_messages import ChatPrompt
from deployments.generation import Generation
from deployments.inbox import Inbox
from deployments.messages import ModelInfo
from deployments.watched_handle import WatchedHandle


async def prompt_ids(tokenizer: WatchedHandle, prompt: ChatPrompt, prompt_param: str) -> list[int]:
    """The rendered prompt's token ids; a prompt the template refuses is a 400 blaming `prompt_param`."""
    ids: list[int] | EngineError = await tokenizer.chat_prompt_ids.remote(
        prompt.messages,
        prompt.add_generation_prompt,
        prompt.tools,
        prompt.continue_final_message,
        prompt.template_kwargs,
    )
    if isinstance(ids, EngineError):
        if ids.param == "messages":  # the Tokenizer names chat completions' field; this route's may differ
            ids.param = prompt_param
        raise from_engine_error(ids, prompt_param)
    return ids


async def prompt_inputs(
    tokenizer: WatchedHandle,
    prompt: ChatPrompt,
    prompt_param: str,
    model_info: Callable[[], Awaitable[ModelInfo]],
    limits: ImageLimitsConfig,
) -> tuple[list[int], ImageInputs | None]:
    """The rendered prompt's token ids and its processed images (None for a text-only prompt)."""
    if not prompt.image_urls:
        return await prompt_ids(tokenizer, prompt, prompt_param), None
    return await image_prompt_inputs(tokenizer, prompt, prompt_param, await model_info(), limits)


async def image_prompt_inputs(
    tokenizer: WatchedHandle,
    prompt: ChatPrompt,
    prompt_param: str,
    info: ModelInfo,
    limits: ImageLimitsConfig,
) -> tuple[list[int], ImageInputs]:
    """A prompt with images: refused by a text-only model, else the images are loaded (api/images.py)
    and the Tokenizer processes them with the rendered prompt. Every failure is a 400."""
    if not info.accepts_images:
        raise invalid(
            prompt_param,
            f"the model {info.model_name!r} accepts no images; send text only, or serve a vision-language "
            "model (docs/vision.md)",
        )
    images = await load_images(list(prompt.image_urls), limits, prompt_param)
    result: tuple[list[int], ImageInputs] | EngineError = await tokenizer.chat_prompt_inputs.remote(
        prompt.messages,
        images,
        limits.max_image_pixels,
        prompt.add_generation_prompt,
        prompt.tools,
        prompt.continue_final_message,
        prompt.template_kwargs,
    )
    if isinstance(result, EngineError):
        raise from_engine_error(result, prompt_param)
    return result


async def start(
    scheduler: WatchedHandle, inbox: Inbox | None, request: GenerateRequest, prompt_param: str
) -> tuple[Generation, ChoiceState]:
    """Starts the request; a rejected one raises its ApiError before any byte goes out."""
    generation = Generation(scheduler, [request], prompt_param, inbox)
    await generation.start()
    return generation, ChoiceState(0, num_prompt_tokens=len(request.prompt_token_ids))


async def collect(generation: Generation, state: ChoiceState) -> None:
    async with aclosing(generation.batches()) as batches:
        async for _, batch in batches:
            state.add(batch)
