"""The Anthropic Messages routes of the Ingress: POST /v1/messages and /v1/messages/count_tokens.

Owns the order of work per request (parse, resolve the model, check fields, render the prompt, generate,
convert); api/anthropic_* own the wire format, the Scheduler owns generation. Errors raised here are
rendered in Anthropic's shape by the app's handlers (every path under /v1/messages). No MLX.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from engine.messages import GenerateRequest, ImageInputs

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from api import sse
from api.anthropic_convert import (
    chat_prompt,
    check_supported,
    fold_system_turns,
    sampling_params,
    tool_choice,
)
from api.anthropic_outputs import MessageMeta, message
from api.anthropic_schemas import CountTokensRequest, MessagesRequest
from api.anthropic_stream import message_events
from api.body import UnknownFields, parse_body
from api.config import ImageLimitsConfig
from api.errors import ApiError
from api.max_tokens import fit_max_tokens
from api.template_messages import ChatPrompt
from deployments import chat_generation
from deployments.served_model import ServedModel, WhenWarm

PROMPT_PARAM = "messages"


class AnthropicRoutes:
    def __init__(
        self,
        resolve: Callable[[str], ServedModel],
        when_warm: WhenWarm,
        unknown_fields: UnknownFields,
    ):
        self._unknown_fields = unknown_fields
        self._resolve = resolve
        self._when_warm = when_warm
        self.image_limits = ImageLimitsConfig()  # the Ingress sets its configured limits

    async def create(self, request: Request) -> Response:
        req = await parse_body(request, MessagesRequest, self._unknown_fields)
        served = self._resolve(req.model)
        check_supported(req)
        return await self._when_warm(served, bool(req.stream), partial(self._create, req, served))

    async def _create(self, req: MessagesRequest, served: ServedModel) -> Response:
        meta = MessageMeta.new(served.model_id)
        params = sampling_params(req)
        parsing = await served.parsers.for_request(tool_choice(req), params, "tool_choice")
        ids, images = await self._rendered(served, chat_prompt(req))
        # Anthropic's max_tokens is a ceiling, and Claude Code sends its own model's (32000) whatever
        # the served context: cap it to the room the prompt leaves; a prompt with no room still fails.
        max_model_len = (await served.info()).max_model_len
        params.max_tokens = fit_max_tokens(params.max_tokens, len(ids), max_model_len, "clamp")
        assert served.scheduler is not None
        generation, state = await chat_generation.start(
            served.scheduler, served.inbox, GenerateRequest(meta.id, ids, params, images), PROMPT_PARAM
        )
        if not req.stream:
            await chat_generation.collect(generation, state)
            return JSONResponse(message(meta, state, parsing).dump())
        frames = message_events(meta, state, generation.batches(), parsing)
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    async def _rendered(
        self, served: ServedModel, prompt: ChatPrompt
    ) -> tuple[list[int], ImageInputs | None]:
        """System messages after the first turn stay in place where the template renders them (Llama 3,
        Qwen, ChatML); a template that refuses them (Gemma, Mistral: system first, roles alternating)
        gets them folded into the system prompt instead. Trying beats guessing from the template's
        source, and costs a second render only on a request that would otherwise fail. A template that
        drops such turns without an error goes unnoticed: the Tokenizer returns ids, not text."""
        try:
            return await self._prompt_inputs(served, prompt)
        except ApiError as exc:
            if exc.status != 400 or (folded := fold_system_turns(prompt)) is None:
                raise
        return await self._prompt_inputs(served, folded)

    async def _prompt_inputs(
        self, served: ServedModel, prompt: ChatPrompt
    ) -> tuple[list[int], ImageInputs | None]:
        assert served.tokenizer is not None
        return await chat_generation.prompt_inputs(
            served.tokenizer, prompt, PROMPT_PARAM, served.info, self.image_limits
        )

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's length exactly as /v1/messages would count it in `usage.input_tokens`."""
        req = await parse_body(request, CountTokensRequest, self._unknown_fields)
        served = self._resolve(req.model)
        check_supported(req)
        ids, _ = await self._rendered(served, chat_prompt(req))
        return JSONResponse({"input_tokens": len(ids)})
