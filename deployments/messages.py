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
    num_output_channels: int = 0  # Ingress output channels open here (deployments/outbox.py)


@dataclass(frozen=True)
class Admitted:
    """The first item of a `generate` stream that named an output channel: the request is in the
    engine of `replica_id`. `on_channel`: its outputs come on that replica's output channel to the
    caller, and the stream carries only heartbeats; else on the stream itself (no such channel is
    open there yet)."""

    replica_id: str
    on_channel: bool


@dataclass(frozen=True)
class ChannelRequest:
    """Opens an output channel: the Scheduler replica `replica_id` sends the outputs of the requests
    that name `channel_id` on it. The request routers send it to that replica and no other."""

    channel_id: str
    replica_id: str
