"""Ingress deployment: the OpenAI-compatible HTTP routes, holding only deployment handles.

Owns the order of work per request (parse, check model and params, tokenize, generate, convert);
api/ owns every wire format, the Scheduler owns generation. No MLX here.

No `from __future__ import annotations` here: @serve.ingress pickles the routes by value, string
annotations lose their globals, and FastAPI then took `request: Request` for a query parameter.
"""

import asyncio
from contextlib import aclosing
from dataclasses import replace
from functools import partial
from typing import Any

from engine.errors import EngineError
from engine.messages import GenerateRequest, ImageInputs, SamplingParams

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from api import sse
from api.anthropic_schemas import CountTokensRequest, MessagesRequest
from api.body import UnknownFields, parse_body
from api.choice_state import ChoiceState, Delta
from api.config import CompatibilityConfig, LimitsConfig, SecurityConfig
from api.error_handlers import install_error_handlers
from api.errors import ApiError, from_engine_error, model_not_found
from api.guard import GuardMiddleware
from api.max_tokens import fit_max_tokens
from api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from api.metrics import render_metrics
from api.openai_convert import (
    DEFAULT_MODEL_ALIAS,
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
)
from api.openai_outputs import (
    ResponseMeta,
    TokenText,
    chat_chunk,
    chat_completion,
    chat_usage_chunk,
    completion,
    completion_chunk,
    completion_usage_chunk,
    embedding_list,
    logprob_token_ids,
)
from api.openai_responses import ChatCompletionChunk, Completion, ModelCard, ModelList
from api.openai_schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from api.openai_stream import sse_frames
from api.openai_tools import tool_choice
from api.openapi import install_openapi, request_body
from api.output_parser import OutputParser
from api.responses_schemas import ResponsesRequest
from api.status import status_body, total_stats
from deployments import chat_generation
from deployments.anthropic_routes import AnthropicRoutes
from deployments.deployment_health import DeploymentWatch, health_body, read_serve_status
from deployments.generation import Generation
from deployments.messages import ModelInfo
from deployments.output_parsing import OutputParsers
from deployments.replica_errors import ProxyGoneMiddleware, install_replica_died_handler
from deployments.replica_stats import gather_stats
from deployments.responses_routes import ResponsesRoutes
from deployments.watched_handle import WatchedHandle

_STATUS_TIMEOUT_S = 10.0

app = FastAPI(title="mlx-ray-serve", docs_url=None, redoc_url=None)
install_error_handlers(app)
install_replica_died_handler(app)  # a dead Tokenizer/Embedder replica: 503, retryable
install_openapi(app)


def _guard_configs() -> tuple[SecurityConfig, LimitsConfig]:
    """The running Ingress's security and limits; read by the guard on its first request."""
    ingress = serve.get_replica_context().servable_object
    return ingress.security, ingress.limits


app.add_middleware(GuardMiddleware, configs=_guard_configs)
app.add_middleware(ProxyGoneMiddleware)  # outermost: every layer below reads its `receive`


# Helpers sit above the class: @serve.ingress freezes the FastAPI app (cloudpickle) when it decorates
# the class, and a name defined below it is missing from the frozen routes' globals (NameError).
async def _collect(generation: Generation, states: list[ChoiceState]) -> None:
    async with aclosing(generation.batches()) as batches:
        async for index, batch in batches:
            states[index].add(batch)


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(
        self,
        scheduler: DeploymentHandle,
        tokenizer: DeploymentHandle,
        embedder: DeploymentHandle | None,
        served_model_name: str | None,
        security: SecurityConfig | None = None,
        limits: LimitsConfig | None = None,
        compatibility: CompatibilityConfig | None = None,
        tool_call_parser: str | None = "auto",
        reasoning_parser: str | None = None,
    ):
        self.security = security or SecurityConfig()  # read by api/guard.py via _guard_configs
        self.limits = limits or LimitsConfig()
        self._compatibility = compatibility or CompatibilityConfig()
        self._unknown_fields = UnknownFields(self._compatibility.strict_request_fields)
        # Every call to another deployment fails fast with a 503 while that deployment is down.
        self._watch = DeploymentWatch(partial(read_serve_status, serve.get_replica_context().app_name))
        try:  # from the start, so that a deployment that fails is logged even before any request
            self._watch.ensure_polling()
        except RuntimeError:  # no event loop in this constructor: the first request starts it
            pass
        scheduler, tokenizer = WatchedHandle(scheduler, self._watch), WatchedHandle(tokenizer, self._watch)
        self._scheduler = scheduler
        self._tokenizer = tokenizer
        self._embedder = WatchedHandle(embedder, self._watch) if embedder is not None else None
        self._served_model_name = served_model_name
        self._info: ModelInfo | None = None
        self._embedding_model: str | None = None
        self._parsers = OutputParsers(tokenizer, tool_call_parser, reasoning_parser)
        self._anthropic = AnthropicRoutes(
            scheduler, tokenizer, self._resolve_model, self._model_info, self._parsers, self._unknown_fields
        )
        self._anthropic.image_limits = self.limits.images
        self._responses = ResponsesRoutes(
            scheduler,
            tokenizer,
            self._resolve_model,
            self._model_info,
            self._parsers,
            self.limits.images,
            self._unknown_fields,
        )

    def __del__(self) -> None:  # Ray Serve calls it when it stops the replica
        self._watch.close()

    @app.get("/health")
    async def health(self) -> JSONResponse:
        """200 once every deployment has a running replica; 503 while one starts or is down, with why."""
        try:
            states = await asyncio.wait_for(self._watch.refresh(), _STATUS_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001  (the controller itself is unreachable: still an answer)
            reason = f"could not read Ray Serve's deployment status: {type(exc).__name__}: {exc}"
            return JSONResponse({"status": "unknown", "error": reason}, status_code=503)
        body = health_body(states)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return ModelList(data=await self._model_cards()).dump()

    @app.get("/v1/models/{model:path}")
    async def model(self, model: str) -> dict[str, Any]:
        """One model by any name a request may give it: "default", its own name or its alias; the
        embedding model by its name."""
        cards = await self._model_cards()
        info = await self._model_info()
        if model in (DEFAULT_MODEL_ALIAS, info.model_name, self._served_model_name):
            return cards[0].dump()
        for card in cards[1:]:
            if model == card.id:
                return card.dump()
        raise model_not_found(model, [card.id for card in cards])

    async def _model_cards(self) -> list[ModelCard]:
        """The served model's card first, then the embedding model's (if enabled)."""
        info = await self._model_info()
        inputs = ["text", "image"] if info.accepts_images else ["text"]
        cards = [
            ModelCard(
                id=self._model_id(info),
                created=0,
                root=info.model_name,
                max_model_len=info.max_model_len,
                input_modalities=inputs,
            )
        ]
        if self._embedder is not None:
            try:
                if self._embedding_model is None:
                    self._embedding_model = await self._embedder.model_name.remote()
                name, max_len = self._embedding_model, await self._embedding_len()
            except ApiError as exc:  # a dead Embedder leaves the chat model listed
                if exc.status != 503:
                    raise
                return cards
            card = ModelCard(
                id=name, created=0, root=name, max_model_len=max_len, output_modalities=["embedding"]
            )
            cards.append(card)
        return cards

    async def _embedding_len(self) -> int:
        assert self._embedder is not None
        length: int = await self._embedder.max_input_tokens.remote()
        return length

    @app.get("/v1/status")
    async def status(self) -> dict[str, Any]:
        """Stats of every Scheduler replica: `broadcast` calls each running replica once (a plain
        handle call reaches one replica only), and the totals add them up."""
        model_id = self._model_id(await self._model_info())  # first: a Scheduler that is down is a 503
        replicas, errors = await gather_stats(self._scheduler, _STATUS_TIMEOUT_S)
        return status_body(model_id, replicas, errors)

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """vLLM's Prometheus metrics, totalled over every Scheduler replica that answered."""
        model_id = self._model_id(await self._model_info())
        replicas, _ = await gather_stats(self._scheduler, _STATUS_TIMEOUT_S)
        text = render_metrics(model_id, total_stats([stats for _, stats in replicas]))
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    @app.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(self, request: Request) -> Response:
        req = await parse_body(request, ChatCompletionRequest, self._unknown_fields)
        model = await self._resolve_model(req.model)
        check_chat_supported(req)
        params = chat_sampling_params(req)
        choice = tool_choice(req.tools, req.tool_choice, req.parallel_tool_calls)
        parsing = await self._parsers.for_request(choice, params, "tool_choice")
        prompt_ids, images = await chat_generation.prompt_inputs(
            self._tokenizer, chat_prompt(req, choice), "messages", self._model_info, self.limits.images
        )
        meta = ResponseMeta.new("chatcmpl", model)
        n = samples_per_prompt(req)
        generation, states = await self._generate(meta, [prompt_ids], params, "messages", n, images)
        if not req.stream:
            await _collect(generation, states)
            texts = await self._token_texts(states)
            return JSONResponse(chat_completion(meta, states, texts, parsing).dump())

        parsers = [OutputParser(parsing) if parsing.active else None for _ in states]

        def chunk(index: int, delta: Delta, first: bool, text: TokenText) -> ChatCompletionChunk | None:
            return chat_chunk(meta, index, delta, first, include_usage(req), text, parsers[index])

        usage_chunk = (lambda: chat_usage_chunk(meta, states)) if include_usage(req) else None
        frames = sse_frames(generation.batches(), states, chunk, usage_chunk, self._texts_for)
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    @app.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
    async def completions(self, request: Request) -> Response:
        req = await parse_body(request, CompletionRequest, self._unknown_fields)
        model = await self._resolve_model(req.model)
        check_completion_supported(req)
        params = completion_sampling_params(req)
        prompts = completion_prompts(req)
        texts = [p for p in prompts if isinstance(p, str)]
        encoded = iter(await self._tokenizer.encode.remote(texts) if texts else [])
        prompt_ids = [next(encoded) if isinstance(p, str) else p for p in prompts]
        meta = ResponseMeta.new("cmpl", model)
        generation, states = await self._generate(meta, prompt_ids, params, "prompt", samples_per_prompt(req))
        if not req.stream:
            await _collect(generation, states)
            return JSONResponse(completion(meta, states, await self._token_texts(states)).dump())

        def chunk(index: int, delta: Delta, first: bool, text: TokenText) -> Completion | None:
            return completion_chunk(meta, index, delta, include_usage(req), text)

        usage_chunk = (lambda: completion_usage_chunk(meta, states)) if include_usage(req) else None
        frames = sse_frames(generation.batches(), states, chunk, usage_chunk, self._texts_for)
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    @app.post("/v1/embeddings", openapi_extra=request_body(EmbeddingRequest))
    async def embeddings(self, request: Request) -> Response:
        req = await parse_body(request, EmbeddingRequest, self._unknown_fields)
        if self._embedder is None:
            raise ApiError(
                404, "embeddings are not enabled on this server", param="model", code="model_not_found"
            )
        if self._embedding_model is None:
            self._embedding_model = await self._embedder.model_name.remote()
        if req.model not in ("default", self._embedding_model):
            raise model_not_found(req.model, [self._embedding_model])
        result = await self._embedder.embed.remote(embedding_inputs(req), req.dimensions)
        if isinstance(result, EngineError):
            raise from_engine_error(result, "input")
        vectors, num_tokens = result
        return JSONResponse(
            embedding_list(self._embedding_model, vectors, num_tokens, req.encoding_format).dump()
        )

    @app.post("/v1/messages", openapi_extra=request_body(MessagesRequest))
    async def anthropic_messages(self, request: Request) -> Response:
        return await self._anthropic.create(request)

    @app.post("/v1/messages/count_tokens", openapi_extra=request_body(CountTokensRequest))
    async def anthropic_count_tokens(self, request: Request) -> Response:
        return await self._anthropic.count_tokens(request)

    @app.post("/v1/responses", openapi_extra=request_body(ResponsesRequest))
    async def responses(self, request: Request) -> Response:
        return await self._responses.create(request)

    # --- helpers ---------------------------------------------------------------------------------

    async def _model_info(self) -> ModelInfo:
        if self._info is None:
            self._info = await self._scheduler.model_info.remote()
        return self._info

    def _model_id(self, info: ModelInfo) -> str:
        return self._served_model_name or info.model_name

    async def _resolve_model(self, requested: str) -> str:
        info = await self._model_info()
        return resolve_model(requested, info.model_name, self._served_model_name)

    async def _generate(
        self,
        meta: ResponseMeta,
        prompts: list[list[int]],
        params: SamplingParams,
        prompt_param: str,
        n: int,
        images: ImageInputs | None = None,
    ) -> tuple[Generation, list[ChoiceState]]:
        """Starts one engine request per prompt, each with `n` samples (choice p * n + j); raises the
        ApiError of a rejected one."""
        ids = [meta.id] if len(prompts) == 1 else [f"{meta.id}-{i}" for i in range(len(prompts))]
        params = await self._fit_max_tokens(params, max(len(p) for p in prompts))
        requests = [GenerateRequest(rid, ids_, params, images, n) for rid, ids_ in zip(ids, prompts)]
        generation = Generation(self._scheduler, requests, prompt_param)
        await generation.start()
        states = [
            ChoiceState(i * n + j, num_prompt_tokens=len(p), counts_prompt=j == 0)
            for i, p in enumerate(prompts)
            for j in range(n)
        ]
        return generation, states

    async def _fit_max_tokens(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """max_tokens_policy 'clamp' lowers an over-long max_tokens to the room the longest prompt leaves."""
        policy = self._compatibility.max_tokens_policy
        if policy == "error" or params.max_tokens is None:
            return params
        max_model_len = (await self._model_info()).max_model_len
        fitted = fit_max_tokens(params.max_tokens, num_prompt_tokens, max_model_len, policy)
        return params if fitted == params.max_tokens else replace(params, max_tokens=fitted)

    async def _token_texts(self, states: list[ChoiceState]) -> TokenText:
        ids = set().union(*(logprob_token_ids(s.logprobs) for s in states))
        return await self._texts_for(ids)

    async def _texts_for(self, ids: set[int]) -> TokenText:
        if not ids:
            return {}
        texts: TokenText = await self._tokenizer.token_texts.remote(sorted(ids))
        return texts
