"""Runs the model for one scheduler plan and returns the logits of the requests that sample.

Owns the model and the paged KV storage; receives block tables, never the block pool.
Decode rows (one new token each) run as one batch; each prefill chunk runs as its own row,
so no row is ever padded.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.paged_attention import KVStorage, LayerShape, PagedLayerCache, StepLayout
from engine.scheduler import ScheduledRequest, SchedulerPlan

import mlx.core as mx
from mlx import nn


class UnsupportedModelError(ValueError):
    pass


@dataclass
class StepLogits:
    items: list[ScheduledRequest]  # the items that sample, in row order of `logits`
    logits: mx.array  # (len(items), vocab) float32


class _ShapeProbe:
    """Records the K/V shapes a layer produces, without evaluating anything."""

    offset = 0

    def __init__(self) -> None:
        self.shape: LayerShape | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.shape = LayerShape(keys.shape[1], keys.shape[3], values.shape[3])
        return keys, values


def probe_layer_shapes(model: nn.Module) -> list[LayerShape]:
    """One lazy forward with probe caches tells each layer's KV heads and head dims."""
    if hasattr(model, "make_cache"):
        kinds = {type(c).__name__ for c in model.make_cache()}
        if not kinds <= {"KVCache", "RotatingKVCache"}:
            raise UnsupportedModelError(
                f"model uses caches {sorted(kinds)}; the paged engine serves attention-only models"
            )
    probes = [_ShapeProbe() for _ in model.layers]
    model(mx.array([[0]]), cache=probes)
    if any(p.shape is None for p in probes):
        raise UnsupportedModelError("some layers never wrote K/V; the paged engine cannot serve this model")
    return [p.shape for p in probes]  # type: ignore[misc]


class ModelRunner:
    def __init__(self, model: nn.Module, storage: KVStorage):
        self.model = model
        self.storage = storage
        self.block_size = storage.block_size

    def execute(self, plan: SchedulerPlan) -> StepLogits:
        decode = [s for s in plan.scheduled if s.num_new_tokens == 1]
        prefill = [s for s in plan.scheduled if s.num_new_tokens > 1]
        items: list[ScheduledRequest] = []
        rows: list[mx.array] = []
        if decode:
            logits = self._forward(decode, 1)[:, -1, :]
            keep = [i for i, s in enumerate(decode) if s.needs_sample]
            items += [decode[i] for i in keep]
            rows.append(logits if len(keep) == len(decode) else logits[mx.array(keep)])
        for item in prefill:
            logits = self._forward([item], item.num_new_tokens)
            if item.needs_sample:
                items.append(item)
                rows.append(logits[:, -1, :])
        logits = mx.concatenate(rows).astype(mx.float32) if rows else mx.zeros((0, 1))
        mx.eval(logits)
        return StepLogits(items, logits)

    def _forward(self, chunk: list[ScheduledRequest], num_new: int) -> mx.array:
        tables = [s.request.block_ids[: -(-(s.start + num_new) // self.block_size)] for s in chunk]
        layout = StepLayout([s.start for s in chunk], num_new, tables, self.block_size)
        tokens = mx.array(
            [s.request.all_token_ids[s.start : s.start + num_new] for s in chunk], dtype=mx.int32
        )
        caches = [PagedLayerCache(self.storage, i, layout) for i in range(len(self.storage.shapes))]
        logits = self.model(tokens, cache=caches)
        # Evaluate the pools now so each forward's scatter can update them in place.
        to_eval = [logits] if chunk[0].needs_sample or num_new == 1 else []
        mx.eval(*to_eval, *self.storage.arrays())
        return logits
