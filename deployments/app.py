"""The one builder: validates the app's args (serve_config.yaml) and wires the deployments.

Owns the app's config (one model, or a `models:` list: deployments/model_config.py) and the wiring;
deployments/options.py owns each deployment's Ray Serve options. `serve run serve_config.yaml` calls
`build_app(args)`.

Ray 2.60 defaults that bite, and what is set here instead:
- `max_ongoing_requests` defaults to 5 per replica. On the Scheduler that would cap the engine's batch
  at 5 running requests, so it must be >= `engine.max_num_seqs` (checked); on the Ingress every open
  stream holds a slot for its whole life, so it is raised too.
- `num_cpus` defaults to 1 per replica and replicas that do not fit stay PENDING forever. The
  Ingress, Tokenizer and Embedder are mostly idle, so they reserve fractions of a core.
- Ray sets OMP_NUM_THREADS to floor(num_cpus) (at least 1) in every worker that does not set it, so
  the BLAS thread count must not be left to OMP_NUM_THREADS. engine/platform/blas.py sets OPENBLAS_NUM_THREADS
  (which OpenBLAS reads first) to its measured default, cpu_count - 1, before loading OpenBLAS;
  `scheduler.num_threads` overrides both variables through the Scheduler's runtime_env, e.g. 1 when
  two replicas share two cores.
- `graceful_shutdown_timeout_s` defaults to 20 s per deployment, and the Ingress stops before the others:
  Ctrl-C on `serve run` with open streams took 18 s. It is 5 s here (each deployment's option), and a
  stopping replica checks for its last request every 0.5 s instead of 2 s.
- Token auth is on by default for the local cluster `serve run` starts (it writes ~/.ray/auth_token).
  Nothing is set for it: serving works without flags (the HTTP proxy checks no token); only the
  dashboard-based CLI needs `RAY_AUTH_MODE=token`, e.g. `RAY_AUTH_MODE=token serve status`.
"""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig

from pydantic import Field, model_validator
from ray.serve import Application, Deployment

from api.config import CompatibilityConfig, LimitsConfig, SecurityConfig
from deployments.embedder import Embedder
from deployments.ingress import Ingress
from deployments.model_config import (
    ModelEntry,
    ParserFields,
    check_names,
    check_scheduler_slots,
    deployment_suffix,
)
from deployments.options import (
    PREFIX_ROUTER,
    DeploymentOptions,
    EmbedderOptions,
    IngressOptions,
    ResponseStoreOptions,
    SchedulerOptions,
)
from deployments.response_store import ResponseStoreServer
from deployments.scheduler import Scheduler
from deployments.served_model import ModelSpec
from deployments.step_loop import HEARTBEAT_S
from deployments.tokenizer import Tokenizer

# The single-model form's settings: with `models:` they go inside an entry instead.
_SINGLE_MODEL_FIELDS = (
    "engine",
    "scheduler",
    "tokenizer",
    "embedder",
    "tool_call_parser",
    "reasoning_parser",
)


class SingleEmbedderOptions(EmbedderOptions):
    enabled: bool = Field(True, description="Serve /v1/embeddings (loads a second, small model).")
    model: str | None = Field(None, description="Embedding model; None: the bundled all-MiniLM-L6-v2.")


class AppConfig(ParserFields):
    models: list[ModelEntry] | None = Field(
        None,
        description="The served models (deployments/model_config.py), the first text model being "
        "'default'. Without it the single-model fields below describe one text model plus the embedder.",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    stream_interval_s: float = Field(
        0.06,
        ge=0,
        le=1,
        description="Least time between two batches of one stream; 0: a batch per step. 0.06: on a 2-core "
        "CPU a single stream sends 1-3 tokens per batch (each batch costs the Ray processes 3-6 ms of the "
        "cores the forward needs) and still gets a batch every 60-90 ms.",
    )
    max_stream_batches_per_s: float | None = Field(
        200.0,
        gt=0,
        description="Batches per second one Scheduler replica sends over all its open streams: past "
        "max_stream_batches_per_s * stream_interval_s streams, each stream's interval grows to "
        "open streams / this, at most 1 s (more tokens per batch, less CPU taken from the step; 200: "
        "16 streams get a batch at most every 80 ms, so a step of up to 0.1 s sends every stream's token "
        "in the step that made it). "
        "None: no cap.",
    )
    output_channels: bool = Field(
        True,
        description="Each Ingress replica gets the outputs of all its streams from a Scheduler replica over "
        "one output channel: one Ray item per stream interval for all of them, not one per stream "
        "(each item costs both processes about a millisecond of CPU; docs/architecture.md). False: "
        "every stream carries its own outputs.",
    )
    stream_keepalive_s: float = Field(
        HEARTBEAT_S,
        gt=0,
        description="A stream whose request waits for a slot (queued, or preempted for KV blocks, or for "
        "an on-demand model's first replica) gets an SSE comment line this often, so that proxies and "
        "clients with read timeouts keep it open. SSE clients skip comments.",
    )
    scheduler: SchedulerOptions = Field(default_factory=SchedulerOptions)
    tokenizer: DeploymentOptions = Field(default_factory=DeploymentOptions)
    embedder: SingleEmbedderOptions = Field(default_factory=SingleEmbedderOptions)
    ingress: IngressOptions = Field(default_factory=IngressOptions)
    response_store: ResponseStoreOptions = Field(
        default_factory=ResponseStoreOptions,
        description="The app's one store of responses for previous_response_id, shared by Ingress replicas.",
    )
    security: SecurityConfig = Field(
        default_factory=SecurityConfig, description="API keys and CORS; fields in api/config.py."
    )
    limits: LimitsConfig = Field(
        default_factory=LimitsConfig, description="Body size, rate limit, request timeout; api/config.py."
    )
    compatibility: CompatibilityConfig = Field(
        default_factory=CompatibilityConfig,
        description="Unknown request fields and over-long max_tokens; api/config.py.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> AppConfig:
        if self.models is not None:
            both = [name for name in _SINGLE_MODEL_FIELDS if name in self.model_fields_set]
            if both:
                raise ValueError(f"with `models:`, {both} go inside a model's entry (docs/scaling.md)")
            if not self.models:
                raise ValueError("models is empty; list at least one text model")
        check_names(self.entries())
        if self.output_channels:
            num_channels = self.ingress.max_replicas()
            for entry in self.entries():
                if entry.generates:
                    check_scheduler_slots(entry.scheduler_options(), entry.engine_config(), num_channels)
        return self

    def entries(self) -> list[ModelEntry]:
        """The served models; the single-model form is a one-entry list, plus its embedder."""
        if self.models is not None:
            return self.models
        engine = self.engine.model_dump(exclude={"model", "served_model_name"}, exclude_unset=True)
        text = ModelEntry(
            model=self.engine.model,
            served_model_name=self.engine.served_model_name,
            engine=engine,
            deployment=self.scheduler.model_dump(exclude_unset=True),
            tokenizer=self.tokenizer,
            tool_call_parser=self.tool_call_parser,
            reasoning_parser=self.reasoning_parser,
        )
        if not self.embedder.enabled:
            return [text]
        options = self.embedder.model_dump(exclude={"enabled", "model"}, exclude_unset=True)
        return [text, ModelEntry(model=self.embedder.model, kind="embedding", deployment=options)]


def _deployment(decorated: type) -> Deployment:
    """@serve.deployment made the class a Deployment; a type checker still sees the class."""
    assert isinstance(decorated, Deployment)
    return decorated


class _Builder:
    """Binds one Scheduler per text/vision model, one Tokenizer per tokenizer family, one Embedder per
    embedding model. The single-model form keeps the plain names Scheduler, Tokenizer and Embedder."""

    def __init__(self, config: AppConfig):
        self._config = config
        self._suffixed = config.models is not None
        self._tokenizers: dict[str, tuple[str, Application]] = {}

    def _name(self, kind: str, key: str) -> str:
        return f"{kind}-{deployment_suffix(key)}" if self._suffixed else kind

    def spec(self, entry: ModelEntry) -> ModelSpec:
        spec = ModelSpec(
            entry.model_id(), entry.names(), entry.kind, entry.source(), entry.max_model_len(),
            entry.on_demand is not None, tool_call_parser=entry.tool_call_parser,
            reasoning_parser=entry.reasoning_parser,
        )  # fmt: skip
        if entry.generates:
            self._bind_generator(entry, spec)
        else:
            name = self._name("Embedder", entry.model_id())
            options = entry.embedder_options().actor_options(entry.on_demand)
            spec.embedder = _deployment(Embedder).options(name=name, **options).bind(entry.model)
            spec.deployment_names = [name]
        return spec

    def _bind_generator(self, entry: ModelEntry, spec: ModelSpec) -> None:
        config = self._config
        engine_args = entry.engine_config().model_dump()
        name = self._name("Scheduler", entry.model_id())
        options = entry.scheduler_options().actor_options(entry.on_demand)
        router = options["request_router_config"]
        if router["request_router_class"] == PREFIX_ROUTER:  # it keys prompts by the engine's blocks
            router["request_router_kwargs"] = {"block_size": entry.engine.block_size}
        spec.scheduler = (
            _deployment(Scheduler)
            .options(name=name, **options)
            .bind(
                engine_args,
                config.stream_interval_s,
                config.max_stream_batches_per_s,
                config.stream_keepalive_s,
                entry.kind == "vision",
            )
        )
        key = entry.tokenizer_key()
        if key not in self._tokenizers:
            tokenizer_name = self._name("Tokenizer", entry.model_id())
            tokenizer_options = entry.tokenizer.actor_options()
            bound = _deployment(Tokenizer).options(name=tokenizer_name, **tokenizer_options).bind(engine_args)
            self._tokenizers[key] = (tokenizer_name, bound)
        tokenizer_name, spec.tokenizer = self._tokenizers[key]
        spec.deployment_names = [name, tokenizer_name]


def build_app(args: dict[str, Any]) -> Application:
    config = AppConfig.model_validate(args or {})
    builder = _Builder(config)
    specs = [builder.spec(entry) for entry in config.entries()]
    store_options = config.response_store
    store = (
        _deployment(ResponseStoreServer)
        .options(name="ResponseStore", **store_options.actor_options())
        .bind(store_options.max_entries, store_options.ttl_s)
    )
    ingress = _deployment(Ingress).options(**config.ingress.actor_options())
    app: Application = ingress.bind(
        specs,
        store,
        config.security.with_env_keys(),
        config.limits,
        config.compatibility,
        config.stream_keepalive_s,
        config.output_channels,
    )
    return app
