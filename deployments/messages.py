"""Plain data the deployments send the Ingress beyond engine/messages.py: model facts and stats.

Builtins and dataclasses only, so Ray pickles them cheaply; no handles, no live objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.messages import EngineStats


@dataclass(frozen=True)
class ModelInfo:
    """What the Ingress needs to know about the served model; answered by a Scheduler replica,
    whose loaded engine is the authority on the name and context length."""

    model_name: str
    max_model_len: int
    eos_token_ids: list[int]
    accepts_images: bool = False  # a vision-language model


@dataclass
class ReplicaStats:
    """One Scheduler replica's answer to a stats broadcast."""

    replica_id: str
    stats: EngineStats
