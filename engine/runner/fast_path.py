"""The contract every device fast path signs: a load-time check that says whether it applies to this model
on this device and, if not, why; and a build that may still refuse once it has probed the model.

Owns only the contract, what a path is chosen for and the checks paths share (`cache_refusal`,
`quantized_kv_refusal`);
engine/runner/backends.py owns the choice and the list of paths, and each path lives in its device's
folder (engine/runner/cpu/, engine/runner/cuda/).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from engine.runner.kv_storage import KVStorage

import mlx.core as mx
from mlx import nn
from mlx_lm.models.cache import KVCache

Head = Callable[[mx.array], mx.array]  # hidden states -> logits (engine/runner/model_head.py)


@dataclass(frozen=True)
class Target:
    """What the paths are chosen for."""

    model: nn.Module
    storage: KVStorage
    device: str  # MLX's device type: "cpu" or "gpu" (Metal or CUDA)
    head: Head | None  # the model's head split from its backbone, None where the model has none
    # The CUDA paths may use the 4-bit rows kernel: engine.cuda_quantized_rows, set by backends.choose.
    quantized_rows: bool = True
    # The CPU's C forward may screen a float32 head for greedy rows: engine.cpu_greedy_screen, likewise.
    greedy_screen: bool = True
    # The CPU's C forward may move the weights it reads onto 2 MB pages: engine.cpu_huge_pages, likewise.
    huge_pages: bool = True
    # The CPU's C forward may keep float32 weights in a smaller exact form: engine.cpu_exact_packing, likewise.
    exact_packing: bool = True
    # Its many-row products may go through oneDNN (engine/runner/cpu/onednn.py): engine.cpu_onednn.
    onednn: bool = True
    # Its many-row 4-bit products may run on AMX (engine/runner/cpu/amx.py): engine.cpu_amx.
    amx: bool = True


class DecodePath(Protocol):
    """Decode rows (one new token each) as one call."""

    def step(self, tokens: mx.array, starts: list[int], tables: list[list[int]]) -> mx.array:
        """tokens (B,) int32 at positions `starts`, with their block tables -> logits (B, vocab), lazy or
        not; writes each row's new K/V into its slot of the pools."""


class ChunkPath(Protocol):
    """A decode path that also takes prefill chunks, as rows of one sequence at consecutive positions
    (the CPU's C forward over quantized weights, where MLX's own quantized matmul is slow)."""

    serves_chunks: bool

    def step(
        self,
        tokens: mx.array,
        starts: list[int],
        tables: list[list[int]],
        logit_rows: list[int] | None = None,
    ) -> mx.array:
        """As DecodePath's, with each row's K/V written before any row attends; logits of `logit_rows`
        only (default: every row), in that order."""


class FastPath(Protocol):
    name: str  # as /v1/status shows it
    role: str  # "decode", "attention", "math" or "prefill"
    setting: str  # the EngineConfig field: None turns it on where `devices` lists the device, False off
    devices: tuple[str, ...]  # where it is on by default

    def applies(self, target: Target) -> str | None:
        """None where the path can serve `target`; else why not, in a few words."""

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[Any, str | None]:
        """(the path, None), or (None, why it refused after all); `picked`: role -> name chosen so far."""


def quantized_kv_refusal(storage: KVStorage, reader: str) -> str | None:
    """Why a path whose `reader` reads K/V of the model dtype straight from the pools must step aside
    for a quantized storage (engine/runner/kv_quant.py), or None."""
    if storage.quant is None:
        return None
    dtype = str(storage.dtype).removeprefix("mlx.core.")
    return f"kv_cache_dtype {storage.kv_cache_dtype}: {reader} reads {dtype} K/V, not quantized pools"


def cache_refusal(model: nn.Module, handles: tuple[type, ...] = (KVCache,)) -> str | None:
    """Why a fast path that models only the cache kinds it `handles` (by default plain causal attention
    over every past token) must step aside for `model`, or None.

    Asks the model's own caches, not attribute names (each architecture marks a windowed layer its own
    way: `use_sliding`, `layer_types`, `is_local`): mlx-lm gives a layer a cache other than a plain KVCache
    (a RotatingKVCache for a sliding window or attention sinks, ArraysCache for recurrent state) exactly
    where that layer keeps something else than every past token's K/V. A model without `make_cache` gets
    plain KVCaches from mlx-lm."""
    make_cache = getattr(model, "make_cache", None)
    if make_cache is None:
        return None
    caches = make_cache()
    kinds = sorted({type(c).__name__ for c in caches if type(c) not in handles})
    if kinds:
        return f"the model's caches hold {', '.join(kinds)}: a sliding window or other state this path does not model"
    num_layers = len(getattr(model, "layers", caches))
    if len(caches) != num_layers:  # layers that share another's KV (gemma3n) or keep none (nemotron-nas)
        return (
            f"the model keeps {len(caches)} caches for {num_layers} layers; this path assumes one per layer"
        )
    return None
