"""The contract every device fast path signs: a load-time check that says whether it applies to this model
on this device and, if not, why; and a build that may still refuse once it has probed the model.

Owns only the contract and what a path is chosen for; engine/runner/backends.py owns the choice and the
list of paths, and each path lives in its device's folder (engine/runner/cpu/, engine/runner/cuda/).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from engine.runner.kv_storage import KVStorage

import mlx.core as mx
from mlx import nn

Head = Callable[[mx.array], mx.array]  # hidden states -> logits (engine/runner/model_head.py)


@dataclass(frozen=True)
class Target:
    """What the paths are chosen for."""

    model: nn.Module
    storage: KVStorage
    device: str  # MLX's device type: "cpu" or "gpu" (Metal or CUDA)
    head: Head | None  # the model's head split from its backbone, None where the model has none


class DecodePath(Protocol):
    """Decode rows (one new token each) as one call."""

    def step(self, tokens: mx.array, starts: list[int], tables: list[list[int]]) -> mx.array:
        """tokens (B,) int32 at positions `starts`, with their block tables -> logits (B, vocab), lazy or
        not; writes each row's new K/V into its slot of the pools."""


class FastPath(Protocol):
    name: str  # as /v1/status shows it
    role: str  # "decode", "attention", "math" or "prefill"
    setting: str  # the EngineConfig field: None turns it on where `devices` lists the device, False off
    devices: tuple[str, ...]  # where it is on by default

    def applies(self, target: Target) -> str | None:
        """None where the path can serve `target`; else why not, in a few words."""

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[Any, str | None]:
        """(the path, None), or (None, why it refused after all); `picked`: role -> name chosen so far."""
