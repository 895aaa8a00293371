"""The OpenAI Responses route of the Ingress: POST /v1/responses.

Owns the order of work per request (parse, resolve the model, check fields, set up tool and reasoning
parsing, look up the previous response, render the prompt, generate, convert, remember the turn); api/responses_* own the wire format,
the Scheduler owns generation, deployments/response_store.py the remembered conversations. No MLX.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from engine.messages import GenerateRequest, ImageInputs

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from api import sse
from api.body import parse_body
from api.config import ImageLimitsConfig
from api.responses_convert import (
    chat_prompt,
    check_supported,
    input_turns,
    previous_not_found,
    sampling_params,
)
from api.responses_items import assistant_turns, whole_output
from api.responses_outputs import OutputItem, ResponseMeta, finished_response, settings
from api.responses_schemas import ResponsesRequest
from api.responses_stream import response_events
from api.responses_tools import tool_choice
from api.template_messages import ChatPrompt, Message
from deployments import chat_generation
from deployments.messages import ModelInfo
from deployments.output_parsing import OutputParsers
from deployments.response_store import ResponseStore
from deployments.watched_handle import WatchedHandle

PROMPT_PARAM = "input"


class ResponsesRoutes:
    def __init__(
        self,
        scheduler: WatchedHandle,
        tokenizer: WatchedHandle,
        resolve_model: Callable[[str], Awaitable[str]],
        model_info: Callable[[], Awaitable[ModelInfo]],
        parsers: OutputParsers,
        image_limits: ImageLimitsConfig,
        store: ResponseStore | None = None,
    ):
        self._scheduler = scheduler
        self._tokenizer = tokenizer
        self._resolve_model = resolve_model
        self._model_info = model_info
        self._parsers = parsers
        self._image_limits = image_limits
        self._store = store or ResponseStore()

    async def create(self, request: Request) -> Response:
        req = await parse_body(request, ResponsesRequest)
        meta = ResponseMeta.new(await self._resolve_model(req.model))
        check_supported(req)
        params = sampling_params(req)
        choice = tool_choice(req)
        parsing = await self._parsers.for_request(choice, params, "tool_choice")
        conversation = self._history(req.previous_response_id) + input_turns(req)
        ids, images = await self._prompt_inputs(chat_prompt(req, conversation))
        generation, state = await chat_generation.start(
            self._scheduler, GenerateRequest(meta.id, ids, params, images), PROMPT_PARAM
        )

        def remember(output: list[OutputItem]) -> None:
            if req.store is not False:
                self._store.put(meta.id, [*conversation, *assistant_turns(output)])

        if not req.stream:
            await chat_generation.collect(generation, state)
            output = whole_output(meta, state, parsing, choice.parallel) if parsing.active else None
            response = finished_response(meta, settings(req), state, output)
            remember(response.output)
            return JSONResponse(response.dump())
        batches = generation.batches()
        frames = response_events(meta, settings(req), state, batches, remember, parsing, choice.parallel)
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    async def _prompt_inputs(self, prompt: ChatPrompt) -> tuple[list[int], ImageInputs | None]:
        return await chat_generation.prompt_inputs(
            self._tokenizer, prompt, PROMPT_PARAM, self._model_info, self._image_limits
        )

    def _history(self, previous_response_id: str | None) -> list[Message]:
        if previous_response_id is None:
            return []
        turns = self._store.get(previous_response_id)
        if turns is None:
            raise previous_not_found(previous_response_id)
        return turns
