"""Ray Serve options of each deployment, as serve_config.yaml spells them, and the reasons for their defaults.

Owns the mapping from typed options to `Deployment.options(...)` keyword arguments; builds nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from ray.serve.config import AutoscalingConfig

# Ray Serve imports the router by this path in every process that holds a Scheduler handle.
PREFIX_ROUTER = "deployments.prefix_router.PrefixAwareRouter"
POWER_OF_TWO_ROUTER = "deployments.prefix_router.PowerOfTwoRouter"  # Ray's choice, plus output channels
# How often a stopping replica checks whether its open requests have finished (Ray's default: 2 s).
_SHUTDOWN_POLL_S = 0.5
# An on-demand model's autoscaler averages ongoing requests over a look-back window (Ray's default:
# 30 s) and then waits its downscale delay: the two together make the idle timeout (half each, the
# window at most this long), so the model stops about idle_timeout_s after its last request.
_MAX_LOOK_BACK_S = 30.0


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OnDemand(Strict):
    """Loaded on the first request for the model, back to zero replicas after `idle_timeout_s` idle."""

    idle_timeout_s: float = Field(
        300.0, gt=0, description="Seconds with no request before the model's replicas are stopped."
    )

    def autoscaling(self, max_replicas: int, given: dict[str, Any] | None) -> dict[str, Any]:
        """Ray Serve's autoscaling for scale-to-zero; `given` (the entry's autoscaling_config) may tune
        the rest, never the floor."""
        look_back_s = min(self.idle_timeout_s / 2, _MAX_LOOK_BACK_S)
        delay_s = self.idle_timeout_s - look_back_s
        config = {
            "max_replicas": max_replicas,
            "upscale_delay_s": 0.0,
            "downscale_delay_s": delay_s,
            "downscale_to_zero_delay_s": delay_s,
            "look_back_period_s": look_back_s,
            "metrics_interval_s": min(look_back_s / 2, 10.0),  # Ray: shorter than the window
        }
        return config | (given or {}) | {"min_replicas": 0, "initial_replicas": 0}


class DeploymentOptions(Strict):
    num_replicas: int = Field(1, ge=1, description="Replicas of this deployment (or autoscaling_config).")
    autoscaling_config: dict[str, Any] | None = Field(
        None,
        description="Ray Serve's autoscaling_config (min_replicas, max_replicas, target_ongoing_requests, "
        "...), instead of num_replicas.",
    )
    num_cpus: float = Field(0.25, ge=0, description="CPU reserved per replica (fractions allowed).")
    num_gpus: float = Field(0, ge=0, description="GPUs reserved per replica (fractions allowed).")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources per replica, e.g. {node_b: 1} to place it on the node that "
        "declares that resource (`ray start --resources`).",
    )
    max_ongoing_requests: int = Field(64, ge=1, description="Requests one replica serves at once.")
    graceful_shutdown_timeout_s: float = Field(
        5.0,
        ge=0,
        description="When a replica stops (Ctrl-C on `serve run`, `serve shutdown`, a smaller num_replicas), "
        "how long its open requests may still run; Ray Serve's own default is 20 s per deployment.",
    )

    @field_validator("autoscaling_config")
    @classmethod
    def _valid_autoscaling(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        if config is not None:
            AutoscalingConfig(**config)  # Ray Serve's own checks, at load time rather than at deploy
        return config

    @model_validator(mode="after")
    def _one_way_to_scale(self) -> DeploymentOptions:
        if self.autoscaling_config is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        return self

    def max_replicas(self) -> int:
        """The most replicas it may run: num_replicas, or its autoscaling_config's max_replicas."""
        if self.autoscaling_config is None:
            return self.num_replicas
        return int(AutoscalingConfig(**self.autoscaling_config).max_replicas)

    def actor_options(self, on_demand: OnDemand | None = None, **extra: Any) -> dict[str, Any]:
        actor = {"num_cpus": self.num_cpus, **extra}
        actor |= {"num_gpus": self.num_gpus} if self.num_gpus else {}
        actor |= {"resources": dict(self.resources)} if self.resources else {}
        return {
            **self._scaling(on_demand),
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": _SHUTDOWN_POLL_S,
            "ray_actor_options": actor,
        }

    def _scaling(self, on_demand: OnDemand | None) -> dict[str, Any]:
        if on_demand is not None:
            given = self.autoscaling_config or {}
            max_replicas = int(given.get("max_replicas", self.num_replicas))
            return {"autoscaling_config": on_demand.autoscaling(max_replicas, given)}
        if self.autoscaling_config is not None:
            return {"autoscaling_config": self.autoscaling_config}
        return {"num_replicas": self.num_replicas}


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
    request_router: Literal["prefix_aware", "power_of_two"] = Field(
        "prefix_aware",
        description="How requests spread over replicas: 'prefix_aware' sends a prompt to the replica whose "
        "prefix cache holds its longest prefix unless that one is busy (deployments/prefix_router.py); "
        "'power_of_two' is Ray Serve's default choice (the less loaded of two random replicas).",
    )

    def runtime_env(self) -> dict[str, Any]:
        if self.num_threads is None:
            return {}
        threads = str(self.num_threads)
        return {"env_vars": {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}}

    def actor_options(self, on_demand: OnDemand | None = None, **extra: Any) -> dict[str, Any]:
        env = self.runtime_env()
        options = super().actor_options(on_demand, **extra, **({"runtime_env": env} if env else {}))
        router = PREFIX_ROUTER if self.request_router == "prefix_aware" else POWER_OF_TWO_ROUTER
        options["request_router_config"] = {"request_router_class": router}
        return options


class IngressOptions(DeploymentOptions):
    max_ongoing_requests: int = Field(256, ge=1, description="Open HTTP requests (streams) per replica.")


class EmbedderOptions(DeploymentOptions):
    # At least the batch the Embedder gathers (deployments/embedder.py's _MAX_BATCH_REQUESTS), or Ray
    # Serve warns that full batches can never form.
    max_ongoing_requests: int = Field(32, ge=1, description="Requests one replica serves at once.")


class ResponseStoreOptions(DeploymentOptions):
    """The one store of finished responses every Ingress replica reads (`previous_response_id`)."""

    num_cpus: float = Field(0.05, ge=0, description="CPU reserved; it only keeps conversations.")
    max_ongoing_requests: int = Field(256, ge=1, description="Lookups and stores served at once.")
    max_entries: int = Field(1024, ge=1, description="Responses kept; the least recently used go first.")
    ttl_s: float = Field(3600.0, gt=0, description="How long a stored response can be continued.")

    @model_validator(mode="after")
    def _one_replica(self) -> ResponseStoreOptions:
        if self.num_replicas != 1 or self.autoscaling_config is not None:
            raise ValueError("response_store runs one replica: every Ingress replica must see the same store")
        return self
