"""The OpenAI Responses route of the Ingress: POST /v1/responses.

Owns the order of work per request (parse, resolve the model, check fields, set up tool and reasoning
parsing, look up the previous response, render the prompt, generate, convert, remember the turn);
api/responses_* own the wire format, the Scheduler owns generation, the Tokenizer the token texts of
logprobs, deployments/response_store.py the remembered conversations. No MLX.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from engine.messages import GenerateRequest, ImageInputs

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from api import sse
from api.body import UnknownFields, parse_body
from api.choice_state import ChoiceState
from api.config import ImageLimitsConfig
from api.errors import ApiError
from api.openai_outputs import TokenText, logprob_token_ids
from api.output_parser import OutputParsing
from api.responses_convert import (
    chat_prompt,
    check_logprobs,
    check_supported,
    input_turns,
    previous_not_found,
    sampling_params,
    wants_logprobs,
)
from api.responses_items import assistant_turns, whole_output
from api.responses_outputs import (
    OutputItem,
    ResponseMeta,
    finished_response,
    logprob_entries,
    settings,
)
from api.responses_schemas import ResponsesRequest
from api.responses_stream import response_events
from api.responses_tools import ToolNames, tool_choice, tool_names
from api.template_messages import ChatPrompt, Message
from deployments import chat_generation
from deployments.generation import Generation
from deployments.inbox import Inbox
from deployments.response_store import LocalStore, Store
from deployments.served_model import ServedModel, WhenWarm
from deployments.watched_handle import WatchedHandle

PROMPT_PARAM = "input"


@dataclass(frozen=True)
class _Reading:
    """How one request's output is read back: parsed items, namespaced call names, logprobs."""

    parsing: OutputParsing
    parallel: bool
    names: ToolNames
    logprobs: bool


class ResponsesRoutes:
    def __init__(
        self,
        resolve: Callable[[str], ServedModel],
        when_warm: WhenWarm,
        image_limits: ImageLimitsConfig,
        unknown_fields: UnknownFields,
        store: Store | None = None,
    ):
        self._unknown_fields = unknown_fields
        self._resolve = resolve
        self._when_warm = when_warm
        self._image_limits = image_limits
        self._store = store or LocalStore()

    async def create(self, request: Request) -> Response:
        req = await parse_body(request, ResponsesRequest, self._unknown_fields)
        served = self._resolve(req.model)
        check_supported(req)
        return await self._when_warm(served, bool(req.stream), partial(self._create, req, served))

    async def _create(self, req: ResponsesRequest, served: ServedModel) -> Response:
        meta = ResponseMeta.new(served.model_id)
        params = sampling_params(req)
        choice = tool_choice(req)
        parsing = await served.parsers.for_request(choice, params, "tool_choice")
        check_logprobs(req, parsing)
        reading = _Reading(parsing, choice.parallel, tool_names(req), wants_logprobs(req))
        conversation = await self._history(req.previous_response_id) + input_turns(req)
        ids, images = await self._prompt_inputs(served, chat_prompt(req, conversation))
        assert served.scheduler is not None
        generation, state = await _start(
            served.scheduler, served.inbox, GenerateRequest(meta.id, ids, params, images), req.truncation
        )

        async def remember(output: list[OutputItem]) -> None:
            if req.store is not False:
                await self._store.put(meta.id, [*conversation, *assistant_turns(output)])

        token_texts = partial(_token_texts, served)
        if not req.stream:
            return await self._whole(req, meta, generation, state, reading, remember, token_texts)
        frames = response_events(
            meta,
            settings(req),
            state,
            generation.batches(),
            remember,
            reading.parsing,
            parallel=reading.parallel,
            names=reading.names,
            token_texts=token_texts if reading.logprobs else None,
        )
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    async def _whole(
        self,
        req: ResponsesRequest,
        meta: ResponseMeta,
        generation: Generation,
        state: ChoiceState,
        reading: _Reading,
        remember: Callable[[list[OutputItem]], Awaitable[None]],
        token_texts: Callable[[set[int]], Awaitable[TokenText]],
    ) -> Response:
        await chat_generation.collect(generation, state)
        output, logprobs = None, None
        if reading.parsing.active:
            output = whole_output(meta, state, reading.parsing, reading.parallel, reading.names)
        elif reading.logprobs and state.logprobs:
            texts = await token_texts(logprob_token_ids(state.logprobs))
            logprobs = logprob_entries(state.logprobs, texts)
        response = finished_response(meta, settings(req), state, output, logprobs)
        await remember(response.output)
        return JSONResponse(response.dump())

    async def _prompt_inputs(
        self, served: ServedModel, prompt: ChatPrompt
    ) -> tuple[list[int], ImageInputs | None]:
        assert served.tokenizer is not None
        return await chat_generation.prompt_inputs(
            served.tokenizer, prompt, PROMPT_PARAM, served.info, self._image_limits
        )

    async def _history(self, previous_response_id: str | None) -> list[Message]:
        if previous_response_id is None:
            return []
        turns = await self._store.get(previous_response_id)
        if turns is None:
            raise previous_not_found(previous_response_id)
        return turns


async def _token_texts(served: ServedModel, ids: set[int]) -> TokenText:
    assert served.tokenizer is not None
    texts: TokenText = await served.tokenizer.token_texts.remote(sorted(ids)) if ids else {}
    return texts


async def _start(
    scheduler: WatchedHandle, inbox: Inbox | None, request: GenerateRequest, truncation: str | None
) -> tuple[Generation, ChoiceState]:
    """Starts generation; with truncation 'auto', a prompt over the context says that none was dropped."""
    try:
        return await chat_generation.start(scheduler, inbox, request, PROMPT_PARAM)
    except ApiError as exc:
        if truncation == "auto" and exc.code == "context_length_exceeded":
            exc.message += " (truncation 'auto' drops no input items on this server: shorten the input)"
        raise
