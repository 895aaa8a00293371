"""Ingress deployment: the OpenAI-compatible HTTP routes, holding only deployment handles.

Owns the order of work per request (parse, check model and params, tokenize, generate, convert);
api/ owns every wire format, the Scheduler owns generation. No MLX here.

No `from __future__ import annotations` here: @serve.ingress pickles the routes by value, string
annotations lose their globals, and FastAPI then took `request: Request` for a query parameter.
"""

import asyncio
import itertools
from collections.abc import Awaitable, Callable
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
from api.deferred_stream import DeferredEventStream
from api.error_handlers import install_error_handlers
from api.errors import from_engine_error
from api.guard import GuardMiddleware
from api.max_tokens import fit_max_tokens
from api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from api.metrics import render_metrics
from api.openai_convert import (
    chat_prompt,
    chat_sampling_params,
    check_chat_supported,
    check_completion_supported,
    completion_prompts,
    completion_sampling_params,
    embedding_inputs,
    include_usage,
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
from api.status import total_stats
from deployments import chat_generation
from deployments.anthropic_routes import AnthropicRoutes
from deployments.deployment_health import DeploymentWatch, ServeStatusReader, health_body
from deployments.generation import Generation
from deployments.model_status import model_card, model_status
from deployments.replica_errors import ProxyGoneMiddleware, install_replica_died_handler
from deployments.replica_header import ReplicaHeaderMiddleware
from deployments.replica_stats import gather_stats
from deployments.response_store import LocalStore, RemoteStore, Store
from deployments.responses_routes import ResponsesRoutes
from deployments.served_model import ModelSpec, ModelTable, ServedModel
from deployments.step_loop import HEARTBEAT_S
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
app.add_middleware(ReplicaHeaderMiddleware)  # which Ingress replica answered (also for refusals)
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
        models: list[ModelSpec],
        response_store: DeploymentHandle | None = None,
        security: SecurityConfig | None = None,
        limits: LimitsConfig | None = None,
        compatibility: CompatibilityConfig | None = None,
        stream_keepalive_s: float = HEARTBEAT_S,
        output_channels: bool = True,
    ):
        self.security = security or SecurityConfig()  # read by api/guard.py via _guard_configs
        self.limits = limits or LimitsConfig()
        self._compatibility = compatibility or CompatibilityConfig()
        self._unknown_fields = UnknownFields(self._compatibility.strict_request_fields)
        self._keepalive_s = stream_keepalive_s
        # Every call to another deployment fails fast with a 503 while that deployment is down.
        self._watch = DeploymentWatch(ServeStatusReader(serve.get_replica_context().app_name))
        try:  # from the start, so that a deployment that fails is logged even before any request
            self._watch.ensure_polling()
        except RuntimeError:  # no event loop in this constructor: the first request starts it
            pass
        self._models = ModelTable([ServedModel(spec, self._watch, output_channels) for spec in models])
        self._cold_tokens = itertools.count()
        store: Store = LocalStore()
        if response_store is not None:
            store = RemoteStore(WatchedHandle(response_store, self._watch))
        self._anthropic = AnthropicRoutes(self._generator, self._when_warm, self._unknown_fields)
        self._anthropic.image_limits = self.limits.images
        self._responses = ResponsesRoutes(
            self._generator, self._when_warm, self.limits.images, self._unknown_fields, store
        )

    def __del__(self) -> None:  # Ray Serve calls it when it stops the replica
        self._watch.close()

    @app.get("/health")
    async def health(self) -> JSONResponse:
        """200 once every deployment has a running replica (or is an on-demand model's, scaled to zero);
        503 while one starts or is down, with why."""
        try:
            states = await asyncio.wait_for(self._watch.refresh(), _STATUS_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001  (the controller itself is unreachable: still an answer)
            reason = f"could not read Ray Serve's deployment status: {type(exc).__name__}: {exc}"
            return JSONResponse({"status": "unknown", "error": reason}, status_code=503)
        on_demand = {m.main_deployment for m in self._models.models if m.spec.on_demand}
        body = health_body(states, on_demand)
        body["models"] = {m.model_id: m.state() for m in self._models.models}
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return ModelList(data=await self._model_cards()).dump()

    @app.get("/v1/models/{model:path}")
    async def model(self, model: str) -> dict[str, Any]:
        """One model by any name a request may give it: "default", its own name or an alias."""
        served = self._models.find(model)
        return (await model_card(served)).dump()

    async def _model_cards(self) -> list[ModelCard]:
        """Every configured model, in config order, with its state; a cold one is not started for it."""
        return [await model_card(served) for served in self._models.models]

    @app.get("/v1/status")
    async def status(self) -> dict[str, Any]:
        """Stats of every Scheduler replica of every model: `broadcast` calls each running replica once.
        The top level is the default model's (as with one model); `models` has each model's."""
        first = self._models.first()
        assert first is not None
        first.check_serving()  # a default model that is down: a 503, as before
        models = {m.model_id: await model_status(m, _STATUS_TIMEOUT_S) for m in self._models.models}
        return {**models[first.model_id], "models": models}

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """vLLM's Prometheus metrics, each model's totalled over its Scheduler replicas that answered."""
        series = []
        for served in self._models.models:
            if served.scheduler is not None and served.is_warm() and served.state() != "failed":
                replicas, _ = await gather_stats(served.scheduler, _STATUS_TIMEOUT_S)
                series.append((served.model_id, total_stats([r.stats for r in replicas])))
        return Response(render_metrics(series), media_type=METRICS_CONTENT_TYPE)

    @app.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(self, request: Request) -> Response:
        req = await parse_body(request, ChatCompletionRequest, self._unknown_fields)
        served = self._generator(req.model)
        check_chat_supported(req)
        return await self._when_warm(served, bool(req.stream), partial(self._chat, req, served))

    async def _chat(self, req: ChatCompletionRequest, served: ServedModel) -> Response:
        params = chat_sampling_params(req)
        choice = tool_choice(req.tools, req.tool_choice, req.parallel_tool_calls)
        parsing = await served.parsers.for_request(choice, params, "tool_choice")
        assert served.tokenizer is not None
        prompt_ids, images = await chat_generation.prompt_inputs(
            served.tokenizer, chat_prompt(req, choice), "messages", served.info, self.limits.images
        )
        meta = ResponseMeta.new("chatcmpl", served.model_id)
        n = samples_per_prompt(req)
        generation, states = await self._generate(served, meta, [prompt_ids], params, "messages", n, images)
        if not req.stream:
            await _collect(generation, states)
            texts = await self._token_texts(served, states)
            return JSONResponse(chat_completion(meta, states, texts, parsing).dump())

        parsers = [OutputParser(parsing) if parsing.active else None for _ in states]

        def chunk(index: int, delta: Delta, first: bool, text: TokenText) -> ChatCompletionChunk | None:
            return chat_chunk(meta, index, delta, first, include_usage(req), text, parsers[index])

        usage_chunk = (lambda: chat_usage_chunk(meta, states)) if include_usage(req) else None
        texts_for = partial(self._texts_for, served)
        frames = sse_frames(generation.batches(), states, chunk, usage_chunk, texts_for)
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    @app.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
    async def completions(self, request: Request) -> Response:
        req = await parse_body(request, CompletionRequest, self._unknown_fields)
        served = self._generator(req.model)
        check_completion_supported(req)
        return await self._when_warm(served, bool(req.stream), partial(self._completion, req, served))

    async def _completion(self, req: CompletionRequest, served: ServedModel) -> Response:
        params = completion_sampling_params(req)
        prompts = completion_prompts(req)
        texts = [p for p in prompts if isinstance(p, str)]
        assert served.tokenizer is not None
        encoded = iter(await served.tokenizer.encode.remote(texts) if texts else [])
        prompt_ids = [next(encoded) if isinstance(p, str) else p for p in prompts]
        meta = ResponseMeta.new("cmpl", served.model_id)
        n = samples_per_prompt(req)
        generation, states = await self._generate(served, meta, prompt_ids, params, "prompt", n)
        if not req.stream:
            await _collect(generation, states)
            return JSONResponse(completion(meta, states, await self._token_texts(served, states)).dump())

        def chunk(index: int, delta: Delta, first: bool, text: TokenText) -> Completion | None:
            return completion_chunk(meta, index, delta, include_usage(req), text)

        usage_chunk = (lambda: completion_usage_chunk(meta, states)) if include_usage(req) else None
        texts_for = partial(self._texts_for, served)
        frames = sse_frames(generation.batches(), states, chunk, usage_chunk, texts_for)
        return sse.EventStreamResponse(frames, on_close=generation.cancel, heartbeat=generation.heartbeat)

    @app.post("/v1/embeddings", openapi_extra=request_body(EmbeddingRequest))
    async def embeddings(self, request: Request) -> Response:
        req = await parse_body(request, EmbeddingRequest, self._unknown_fields)
        served = self._models.embedder(req.model)
        served.check_serving()
        assert served.embedder is not None
        result = await served.embedder.embed.remote(embedding_inputs(req), req.dimensions)
        if isinstance(result, EngineError):
            raise from_engine_error(result, "input")
        vectors, num_tokens = result
        return JSONResponse(embedding_list(served.model_id, vectors, num_tokens, req.encoding_format).dump())

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

    def _generator(self, requested: str) -> ServedModel:
        """The text or vision model a request names; a 404 for an unknown name, a 503 naming the model
        if its deployments cannot start."""
        served = self._models.generator(requested)
        served.check_serving()
        return served

    async def _when_warm(
        self, served: ServedModel, stream: bool, make: Callable[[], Awaitable[Response]]
    ) -> Response:
        """`make()`'s response. For a model with no replica yet (on demand, or starting) the wait is
        counted in /v1/status, and a stream starts at once with keep-alive comments until it is made."""
        if served.is_warm():
            return await make()
        token = next(self._cold_tokens)

        async def made() -> Response:
            served.cold_wait_started(token)
            try:
                return await make()
            finally:
                served.cold_wait_ended(token)

        return DeferredEventStream(made, self._keepalive_s) if stream else await made()

    async def _generate(
        self,
        served: ServedModel,
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
        params = await self._fit_max_tokens(served, params, max(len(p) for p in prompts))
        requests = [GenerateRequest(rid, ids_, params, images, n) for rid, ids_ in zip(ids, prompts)]
        assert served.scheduler is not None
        generation = Generation(served.scheduler, requests, prompt_param, served.inbox)
        await generation.start()
        states = [
            ChoiceState(i * n + j, num_prompt_tokens=len(p), counts_prompt=j == 0)
            for i, p in enumerate(prompts)
            for j in range(n)
        ]
        return generation, states

    async def _fit_max_tokens(
        self, served: ServedModel, params: SamplingParams, num_prompt_tokens: int
    ) -> SamplingParams:
        """max_tokens_policy 'clamp' lowers an over-long max_tokens to the room the longest prompt leaves."""
        policy = self._compatibility.max_tokens_policy
        if policy == "error" or params.max_tokens is None:
            return params
        max_model_len = (await served.info()).max_model_len
        fitted = fit_max_tokens(params.max_tokens, num_prompt_tokens, max_model_len, policy)
        return params if fitted == params.max_tokens else replace(params, max_tokens=fitted)

    async def _token_texts(self, served: ServedModel, states: list[ChoiceState]) -> TokenText:
        ids = set().union(*(logprob_token_ids(s.logprobs) for s in states))
        return await self._texts_for(served, ids)

    async def _texts_for(self, served: ServedModel, ids: set[int]) -> TokenText:
        if not ids:
            return {}
        assert served.tokenizer is not None
        texts: TokenText = await served.tokenizer.token_texts.remote(sorted(ids))
        return texts
