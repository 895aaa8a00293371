"""The Ingress's view of each configured model: its names, its deployments' handles, its parsers and what
its engine told about it, and the table that resolves a request's `model` to one of them.

Owns name resolution ('default' names the first model of the route's kind) and each model's cached
`ModelInfo`; holds handles only, no MLX. `ModelSpec` is the plain data build_app binds the Ingress with.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from api.errors import model_not_found
from api.openai_convert import DEFAULT_MODEL_ALIAS
from deployments.deployment_health import DeploymentState, DeploymentWatch, deployment_down
from deployments.inbox import Inbox
from deployments.messages import ModelInfo
from deployments.output_parsing import OutputParsers
from deployments.watched_handle import WatchedHandle


@dataclass
class ModelSpec:
    """One configured model as the Ingress is told it. The deployment fields hold bound deployments in
    build_app and handles once Ray Serve built the app (it swaps them anywhere in the arguments)."""

    model_id: str
    names: list[str]  # every name a request may use besides 'default', the served name first
    kind: str  # "text", "vision" or "embedding"
    root: str  # what it is loaded from (vLLM's `root`)
    max_model_len: int | None = None  # configured; else the engine's, once it answered
    on_demand: bool = False
    scheduler: Any = None
    tokenizer: Any = None
    embedder: Any = None
    tool_call_parser: str | None = "auto"
    reasoning_parser: str | None = None
    deployment_names: list[str] = field(default_factory=list)  # scheduler/embedder first, then tokenizer

    @property
    def generates(self) -> bool:
        return self.kind != "embedding"


class ServedModel:
    def __init__(self, spec: ModelSpec, watch: DeploymentWatch, output_channels: bool = True):
        self.spec = spec
        self._watch = watch
        self.scheduler = WatchedHandle(spec.scheduler, watch) if spec.scheduler is not None else None
        self.tokenizer = WatchedHandle(spec.tokenizer, watch) if spec.tokenizer is not None else None
        self.embedder = WatchedHandle(spec.embedder, watch) if spec.embedder is not None else None
        # The output channels to its Scheduler replicas: one Ray item per interval for all streams.
        self.inbox = Inbox(self.scheduler) if self.scheduler is not None and output_channels else None
        self.parsers = OutputParsers(self.tokenizer, spec.tool_call_parser, spec.reasoning_parser)  # type: ignore[arg-type]
        self._info: ModelInfo | None = None
        self.max_input_tokens: int | None = None  # an embedding model's, once its Embedder answered
        self._cold_waits: dict[int, float] = {}  # requests waiting for a first replica -> when they came

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    @property
    def main_deployment(self) -> str:
        return self.spec.deployment_names[0]

    async def info(self) -> ModelInfo:
        """The engine's facts (asks a Scheduler replica once; a cold on-demand model starts for it)."""
        if self._info is None:
            assert self.scheduler is not None, "only a generating model has a Scheduler"
            self._info = await self.scheduler.model_info.remote()
        return self._info

    def known_info(self) -> ModelInfo | None:
        return self._info

    def max_model_len(self) -> int | None:
        if self._info is not None:
            return self._info.max_model_len
        return self.spec.max_model_len if self.spec.generates else self.max_input_tokens

    def state(self) -> str:
        """'loaded' (a replica runs), 'failed' (one of its deployments cannot start), 'loading' (a replica
        is starting), or 'cold' (an on-demand model with no replica and none asked for)."""
        if self._down() is not None:
            return "failed"
        main = self.deployment_state(self.main_deployment)
        if main is not None and main.num_running > 0:
            return "loaded"
        scaling_up = main is not None and main.status in ("UPSCALING", "UPDATING")
        return "cold" if self.spec.on_demand and not scaling_up and not self._cold_waits else "loading"

    def deployment_state(self, name: str) -> DeploymentState | None:
        return self._watch.states().get(name)

    def check_serving(self) -> None:
        """Raises the 503 that names this model if one of its deployments cannot start."""
        down = self._down()
        if down is not None:
            raise deployment_down(down, self.model_id)

    def _down(self) -> DeploymentState | None:
        """The first of its deployments that cannot start, if any."""
        states = (self.deployment_state(name) for name in self.spec.deployment_names)
        return next((s for s in states if s is not None and s.problem is not None), None)

    def is_warm(self) -> bool:
        main = self.deployment_state(self.main_deployment)
        return main is None or main.num_running > 0  # unknown (no poll yet): assume it serves

    def cold_wait_started(self, token: int) -> None:
        self._cold_waits[token] = time.monotonic()

    def cold_wait_ended(self, token: int) -> None:
        self._cold_waits.pop(token, None)

    def cold_waits(self) -> dict[str, Any]:
        """Requests waiting for this model's first replica, and how long the oldest has waited."""
        if not self._cold_waits or self.is_warm():
            return {"num_waiting": 0, "longest_wait_s": 0.0}
        longest_s = time.monotonic() - min(self._cold_waits.values())
        return {"num_waiting": len(self._cold_waits), "longest_wait_s": round(longest_s, 3)}


# The Ingress's `_when_warm(served, stream, make)`: the response `make()` gives, waiting for a first replica.
WhenWarm = Callable[[ServedModel, bool, Callable[[], Awaitable[Response]]], Awaitable[Response]]


class ModelTable:
    """Resolves a request's `model`. Served names and aliases first; then each model's source names
    (path, hub id, own name), which go to the first model that has them."""

    def __init__(self, models: list[ServedModel]):
        self.models = models
        self._by_name: dict[str, ServedModel] = {}
        for model in models:  # served names and aliases: unique (deployments/model_config.check_names)
            self._by_name[model.model_id] = model
        for model in models:
            for name in model.spec.names:
                self._by_name.setdefault(name, model)

    def generator(self, requested: str) -> ServedModel:
        return self._resolve(requested, generates=True)

    def embedder(self, requested: str) -> ServedModel:
        return self._resolve(requested, generates=False)

    def find(self, requested: str) -> ServedModel:
        """A model of any kind by any of its names (GET /v1/models/{model})."""
        model = self.first() if requested == DEFAULT_MODEL_ALIAS else self._lookup(requested)
        if model is None:
            raise model_not_found(requested, [m.model_id for m in self.models])
        return model

    def first(self, generates: bool = True) -> ServedModel | None:
        return next((m for m in self.models if m.spec.generates == generates), None)

    def _resolve(self, requested: str, generates: bool) -> ServedModel:
        model = self.first(generates) if requested == DEFAULT_MODEL_ALIAS else self._lookup(requested)
        if model is None or model.spec.generates != generates:
            raise model_not_found(
                requested, [m.model_id for m in self.models if m.spec.generates == generates]
            )
        return model

    def _lookup(self, requested: str) -> ServedModel | None:
        model = self._by_name.get(requested)
        if model is not None:
            return model
        # The engine's own name of a model, once it answered (a directory's name may differ from its path's).
        return next((m for m in self.models if (i := m.known_info()) and i.model_name == requested), None)
