"""One served model as serve_config.yaml's `models:` list spells it: source, kind, names, engine settings,
deployment options, parsers and on-demand loading. Validated here, once; builds nothing.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from engine.config import BUNDLED_EMBEDDING_NAME, DEFAULT_MODEL, EngineConfig, source_name, tokenizer_source

from pydantic import Field, field_validator, model_validator

from api.openai_convert import DEFAULT_MODEL_ALIAS
from api.reasoning_parsers import check_name as check_reasoning_name
from api.tool_parsers import canonical_name
from deployments.options import DeploymentOptions, EmbedderOptions, OnDemand, SchedulerOptions, Strict

Kind = Literal["text", "vision", "embedding"]
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# Settings that only a generating model has; an embedding entry that sets one is refused.
_GENERATION_ONLY = ("engine", "tokenizer", "tool_call_parser", "reasoning_parser")


class ParserFields(Strict):
    """How a generating model's output is read: tool calls and reasoning (docs/tools.md)."""

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


class ModelEntry(ParserFields):
    model: str | None = Field(
        None,
        description="An mlx-lm (or mlx-vlm, mlx-embeddings) directory, a hub id, or a bundled name; None: "
        f"the bundled model of its kind ({DEFAULT_MODEL}, or {BUNDLED_EMBEDDING_NAME} for embeddings).",
    )
    kind: Kind = Field(
        "text",
        description="'text' and 'vision' run a Scheduler (vision: the model must take images, or it fails "
        "to load); 'embedding' runs an Embedder for /v1/embeddings.",
    )
    served_model_name: str | None = Field(None, description="The name responses carry; default: the model's.")
    aliases: list[str] = Field(default_factory=list, description="More names requests may use.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="Engine settings (engine/config.py), except model and name."
    )
    deployment: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray Serve options of the model's Scheduler (deployments/options.py SchedulerOptions) "
        "or Embedder (EmbedderOptions): num_replicas or autoscaling_config, num_cpus, num_gpus, resources, "
        "max_ongoing_requests, ...",
    )
    tokenizer: DeploymentOptions = Field(
        default_factory=DeploymentOptions,
        description="The Tokenizer's options; models that share a tokenizer share the first one's.",
    )
    on_demand: OnDemand | None = Field(
        None, description="Start on the first request, stop after idle_timeout_s (Ray Serve scale to zero)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        misplaced = {"model", "served_model_name"} & self.engine.model_fields_set
        if misplaced:
            raise ValueError(f"put {sorted(misplaced)} at the entry's top level, not under engine")
        if self.kind == "embedding":
            wrong = [name for name in _GENERATION_ONLY if name in self.model_fields_set]
            if wrong:
                raise ValueError(f"an embedding model takes none of {wrong}")
            self.embedder_options()
        else:
            check_scheduler_slots(self.scheduler_options(), self.engine_config())
        return self

    @property
    def generates(self) -> bool:
        return self.kind != "embedding"

    def engine_config(self) -> EngineConfig:
        update = {"model": self.model or DEFAULT_MODEL, "served_model_name": self.served_model_name}
        return self.engine.model_copy(update=update)

    def source(self) -> str:
        """What the model was loaded from (vLLM's `root`)."""
        if self.model is not None:
            return self.model
        return DEFAULT_MODEL if self.generates else BUNDLED_EMBEDDING_NAME

    def model_id(self) -> str:
        """The name responses carry and /v1/models lists."""
        return self.served_model_name or source_name(self.source())

    def names(self) -> list[str]:
        """Every name a request may give this model besides 'default'."""
        names = [self.model_id(), *self.aliases, self.source(), source_name(self.source())]
        return list(dict.fromkeys(names))

    def tokenizer_key(self) -> str:
        return tokenizer_source(self.source())

    def scheduler_options(self) -> SchedulerOptions:
        return SchedulerOptions.model_validate(self.deployment)

    def embedder_options(self) -> EmbedderOptions:
        return EmbedderOptions.model_validate(self.deployment)

    def max_model_len(self) -> int | None:
        return self.engine.max_model_len if self.generates else None


def check_scheduler_slots(scheduler: SchedulerOptions, engine: EngineConfig, num_channels: int = 0) -> None:
    """`num_channels`: the Ingress replicas' output channels, each holding one slot of every replica."""
    slots = scheduler.max_ongoing_requests - num_channels
    held = f" less {num_channels} for the Ingress replicas' output channels" if num_channels else ""
    if slots < engine.max_num_seqs:
        raise ValueError(
            f"scheduler.max_ongoing_requests {scheduler.max_ongoing_requests}{held} is below "
            f"engine.max_num_seqs {engine.max_num_seqs}, so Ray Serve would cap the batch; "
            "raise it or lower max_num_seqs"
        )
    waiting = engine.max_waiting_requests
    if waiting is not None and slots <= engine.max_num_seqs + waiting:
        # Ray Serve queues whatever is past max_ongoing_requests in its router, unbounded and unseen
        # by the engine, so the engine's bound (and its 503/529) would never be reached.
        raise ValueError(
            f"scheduler.max_ongoing_requests {scheduler.max_ongoing_requests}{held} must exceed "
            f"engine.max_num_seqs + engine.max_waiting_requests ({engine.max_num_seqs} + {waiting}), "
            "or Ray Serve queues requests before the engine's waiting-queue bound refuses them"
        )


def check_names(entries: list[ModelEntry]) -> None:
    """Each served name and alias picks one model; at least one model generates text. (A model's source
    names are only a fallback: deployments/served_model.py gives them to the first model that has them.)"""
    owners: dict[str, str] = {}
    for entry in entries:
        for name in dict.fromkeys([entry.model_id(), *entry.aliases]):
            if name == DEFAULT_MODEL_ALIAS:
                raise ValueError(
                    f"'{DEFAULT_MODEL_ALIAS}' names the first model; name {entry.model_id()!r} otherwise"
                )
            if name in owners:
                raise ValueError(
                    f"the name {name!r} is used by both {owners[name]!r} and {entry.model_id()!r}; "
                    "set served_model_name or aliases so that each name picks one model"
                )
            owners[name] = entry.model_id()
    if not any(entry.generates for entry in entries):
        raise ValueError("models lists no text or vision model; the chat routes need one")


def deployment_suffix(model_id: str) -> str:
    """A model's id as it may appear in a deployment name."""
    return _UNSAFE.sub("_", model_id)
