"""The one builder: validates the app's args (serve_config.yaml) and wires the deployments.

Owns the Ray Serve options of every deployment and the reasons for their values; nothing else.
`serve run serve_config.yaml` calls `build_app(args)`.

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

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from ray.serve import Application, Deployment

from api.config import CompatibilityConfig, LimitsConfig, SecurityConfig
from api.reasoning_parsers import check_name as check_reasoning_name
from api.tool_parsers import canonical_name
from deployments.embedder import Embedder
from deployments.ingress import Ingress
from deployments.scheduler import Scheduler
from deployments.step_loop import HEARTBEAT_S
from deployments.tokenizer import Tokenizer

# How often a stopping replica checks whether its open requests have finished (Ray's default: 2 s).
_SHUTDOWN_POLL_S = 0.5


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeploymentOptions(_Strict):
    num_replicas: int = Field(1, ge=1, description="Replicas of this deployment.")
    num_cpus: float = Field(0.25, ge=0, description="CPU reserved per replica (fractions allowed).")
    max_ongoing_requests: int = Field(64, ge=1, description="Requests one replica serves at once.")
    graceful_shutdown_timeout_s: float = Field(
        5.0,
        ge=0,
        description="When a replica stops (Ctrl-C on `serve run`, `serve shutdown`, a smaller num_replicas), "
        "how long its open requests may still run; Ray Serve's own default is 20 s per deployment.",
    )

    def actor_options(self, **extra: Any) -> dict[str, Any]:
        return {
            "num_replicas": self.num_replicas,
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": _SHUTDOWN_POLL_S,
            "ray_actor_options": {"num_cpus": self.num_cpus, **extra},
        }


class SchedulerOptions(DeploymentOptions):
    num_cpus: float = Field(1.0, ge=0, description="CPU reserved per replica; the engine is the hot path.")
    max_ongoing_requests: int = Field(
        128,
        ge=1,
        description="Open streams per replica; beyond max_num_seqs they wait in the engine's queue.",
    )
    num_threads: int | None = Field(
        None, ge=1, description="BLAS threads per replica; default: engine/platform/blas.py's cpu_count - 1."
    )

    def runtime_env(self) -> dict[str, Any]:
        if self.num_threads is None:
            return {}
        threads = str(self.num_threads)
        return {"env_vars": {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}}

    def actor_options(self, **extra: Any) -> dict[str, Any]:
        env = self.runtime_env()
        return super().actor_options(**extra, **({"runtime_env": env} if env else {}))


class IngressOptions(DeploymentOptions):
    max_ongoing_requests: int = Field(256, ge=1, description="Open HTTP requests (streams) per replica.")


class EmbedderOptions(DeploymentOptions):
    enabled: bool = Field(True, description="Serve /v1/embeddings (loads a second, small model).")
    model: str | None = Field(None, description="Embedding model; None: the bundled all-MiniLM-L6-v2.")
    max_ongoing_requests: int = Field(16, ge=1, description="Requests one replica serves at once.")


class AppConfig(_Strict):
    engine: EngineConfig = Field(default_factory=EngineConfig)
    stream_interval_s: float = Field(
        0.02, ge=0, le=1, description="Least time between two batches of one stream; 0: a batch per step."
    )
    max_stream_batches_per_s: float | None = Field(
        25.0,
        gt=0,
        description="Batches per second one Scheduler replica sends over all its open streams: past "
        "max_stream_batches_per_s * stream_interval_s streams, each stream's interval grows to "
        "open streams / this, at most 1 s (more tokens per batch, less CPU taken from the step). "
        "None: no cap.",
    )
    stream_keepalive_s: float = Field(
        HEARTBEAT_S,
        gt=0,
        description="A stream whose request waits for a slot (queued, or preempted for KV blocks) gets "
        "an SSE comment line this often once its Scheduler confirms it still holds the request, so "
        "that proxies and clients with read timeouts keep it open. SSE clients skip comments.",
    )
    scheduler: SchedulerOptions = Field(default_factory=SchedulerOptions)
    tokenizer: DeploymentOptions = Field(default_factory=DeploymentOptions)
    embedder: EmbedderOptions = Field(default_factory=EmbedderOptions)
    ingress: IngressOptions = Field(default_factory=IngressOptions)
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
    tool_call_parser: str | None = Field(
        "auto",
        description="Tool-call format read from the output (docs/tools.md): 'auto' (from the chat "
        "template), a name in api/tool_parsers (hermes, qwen3_coder, llama3_json, mistral, deepseek, glm45, "
        "kimi_k2, minimax_m2, nemotron, lfm2, openai, or an alias), "
        "or None to refuse requests with tools.",
    )
    reasoning_parser: str | None = Field(
        None,
        description="'qwen3' or 'deepseek_r1': split <think> reasoning out of the answer; 'openai_gptoss' "
        "(alias 'gpt_oss'): gpt-oss Harmony analysis messages are reasoning; None: off.",
    )

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, name: str | None) -> str | None:
        return None if name is None else canonical_name(name)

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
        return None if name is None else check_reasoning_name(name)

    @model_validator(mode="after")
    def _check_scheduler_slots(self) -> AppConfig:
        if self.scheduler.max_ongoing_requests < self.engine.max_num_seqs:
            raise ValueError(
                f"scheduler.max_ongoing_requests {self.scheduler.max_ongoing_requests} is below "
                f"engine.max_num_seqs {self.engine.max_num_seqs}, so Ray Serve would cap the batch; "
                "raise it or lower max_num_seqs"
            )
        waiting = self.engine.max_waiting_requests
        if waiting is not None and self.scheduler.max_ongoing_requests <= self.engine.max_num_seqs + waiting:
            # Ray Serve queues whatever is past max_ongoing_requests in its router, unbounded and unseen
            # by the engine, so the engine's bound (and its 503/529) would never be reached.
            raise ValueError(
                f"scheduler.max_ongoing_requests {self.scheduler.max_ongoing_requests} must exceed "
                f"engine.max_num_seqs + engine.max_waiting_requests ({self.engine.max_num_seqs} + {waiting}), "
                "or Ray Serve queues requests before the engine's waiting-queue bound refuses them"
            )
        return self


def _deployment(decorated: type) -> Deployment:
    """@serve.deployment made the class a Deployment; a type checker still sees the class."""
    assert isinstance(decorated, Deployment)
    return decorated


def build_app(args: dict[str, Any]) -> Application:
    config = AppConfig.model_validate(args or {})
    engine_args = config.engine.model_dump()
    scheduler = (
        _deployment(Scheduler)
        .options(**config.scheduler.actor_options())
        .bind(
            engine_args, config.stream_interval_s, config.max_stream_batches_per_s, config.stream_keepalive_s
        )
    )
    tokenizer = _deployment(Tokenizer).options(**config.tokenizer.actor_options()).bind(engine_args)
    embedder = None
    if config.embedder.enabled:
        embedder = (
            _deployment(Embedder).options(**config.embedder.actor_options()).bind(config.embedder.model)
        )
    ingress = _deployment(Ingress).options(**config.ingress.actor_options())
    security = config.security.with_env_keys()
    app: Application = ingress.bind(
        scheduler,
        tokenizer,
        embedder,
        config.engine.served_model_name,
        security,
        config.limits,
        config.compatibility,
        tool_call_parser=config.tool_call_parser,
        reasoning_parser=config.reasoning_parser,
    )
    return app
