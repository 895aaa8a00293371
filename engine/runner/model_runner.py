"""Runs the model for one scheduler plan and returns the logits of the requests that sample.

Owns the model and the paged KV storage; receives block tables, never the block pool.
Decode rows (one new token each) run as one batch; each prefill chunk runs as its own row,
so no row is ever padded. Nothing here waits for the device: the logits come back lazy, and a
decode row whose input token is still pending takes it from the previous step's device tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.scheduler import ScheduledRequest, SchedulerPlan
from engine.messages import ComputePaths
from engine.models.vision_model import model_inputs
from engine.platform.blas import blas_state, blas_thread_setter
from engine.runner import attention_hook
from engine.runner.cpu import activation_hook
from engine.runner.cpu.cpu_decode import make_cpu_decode
from engine.runner.cpu.paired_prefill import make_paired_prefill
from engine.runner.cuda.decode_graph import make_decode_graph
from engine.runner.model_head import split_head
from engine.runner.paged_attention import KVStorage, LayerShape, PagedLayerCache, StepLayout

import mlx.core as mx
from mlx import nn

# Paired prefill chunks are at least this close in length (engine/runner/cpu/paired_prefill.py).
MIN_PAIR_RATIO = 0.5


class UnsupportedModelError(ValueError):
    pass


@dataclass
class StepLogits:
    items: list[ScheduledRequest]  # the items that sample, in row order of `logits`
    logits: mx.array  # (len(items), vocab) float32, lazy


@dataclass
class DeviceTokens:
    """Tokens a launched step sampled on the device and nobody has read yet."""

    items: list[ScheduledRequest]  # row i of token_ids belongs to items[i]
    token_ids: mx.array  # (len(items),) int32, lazy

    def __post_init__(self) -> None:
        self.rows = {item.request.request_id: i for i, item in enumerate(self.items)}


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
    def __init__(
        self,
        model: nn.Module,
        storage: KVStorage,
        kv_in_place: bool | None = None,
        cpu_math: bool | None = None,
        paired_prefill: bool | None = None,
        cpu_decode: bool | None = None,
    ):
        self.model = model
        self.storage = storage
        self.block_size = storage.block_size
        # MLX's CUDA backend: decode rows run as one compiled, bucketed graph with the paged attention
        # kernel (engine/runner/cuda/decode_graph.py); None on other devices, which keep the eager path below.
        self.decode_graph = make_decode_graph(model, storage)
        # On the CPU, batched decode attention reads K/V in place (engine/runner/cpu/window_attention.py) where
        # every layer is full attention and routes through the hook; elsewhere (Metal: not measured
        # there) and for other models it gathers the context through the block tables.
        in_place = (
            (kv_in_place if kv_in_place is not None else mx.default_device().type == mx.DeviceType.cpu)
            and self.decode_graph is None
            and attention_hook.full_attention(model)
            and attention_hook.routes_every_layer(model)
        )
        self.pool_tokens = storage.keys[0].shape[1] * self.block_size if in_place else None
        # MLX's CPU exp is scalar code: attention's softmax and the MLP's SiLU run on engine/runner/cpu/cpu_math.py's
        # instead, through the attention hook and a swap of mlx-lm's swiglu.
        on_cpu = mx.default_device().type == mx.DeviceType.cpu
        self.cpu_math = (cpu_math if cpu_math is not None else on_cpu) and self.decode_graph is None
        if self.cpu_math:
            attention_hook.install(model)
            activation_hook.install(model)
        # A prefill chunk needs logits for its last token only (engine/runner/model_head.py); None: the
        # model's own call computes them for every token. None for VLMs too (no `model` backbone),
        # whose prefill needs the extra inputs of `model_inputs`.
        self.head = split_head(model)
        # On the CPU, a step's prefill chunks run two at a time on two streams
        # (engine/runner/cpu/paired_prefill.py); it needs the head split to take their last rows.
        pair = paired_prefill if paired_prefill is not None else on_cpu
        self.paired = make_paired_prefill(model, blas_thread_setter()) if pair and self.head else None
        # On the CPU, decode rows of a plain float32 Llama-family model run as one C forward
        # (engine/runner/cpu/cpu_decode.py); None elsewhere, and for every other model.
        use_c = (cpu_decode if cpu_decode is not None else on_cpu) and self.decode_graph is None
        self.cpu_decode = make_cpu_decode(model, storage) if use_c else None

    def compute_paths(self) -> ComputePaths:
        """Which of the paths above this runner took, for the status endpoint and the load log."""
        blas = blas_state()
        decode = "mlx"
        if self.cpu_decode is not None:
            decode = "c_forward"
        elif self.decode_graph is not None:
            decode = "cuda_graph"
        return ComputePaths(
            device=mx.default_device().type.name,
            dtype=str(self.storage.keys[0].dtype).removeprefix("mlx.core."),
            blas=blas.name,
            blas_detail=blas.reason,
            blas_config=blas.config,
            blas_core=blas.core,
            decode=decode,
            paired_prefill=self.paired is not None,
        )

    def execute(self, plan: SchedulerPlan, pending: DeviceTokens | None = None) -> StepLogits:
        decode = [s for s in plan.scheduled if s.num_new_tokens == 1]
        prefill = [s for s in plan.scheduled if s.num_new_tokens > 1]
        items: list[ScheduledRequest] = []
        rows: list[mx.array] = []
        # Chunks of similar length two by two (a short partner would leave the long chunk alone
        # on one BLAS thread, slower than two); the rest one by one.
        pairs, singles = pair_chunks(prefill) if self.paired is not None else ([], prefill)
        for pair in pairs:  # before anything else is launched: it changes the BLAS thread count
            for item, logits in zip(pair, self._forward_pair(pair)):
                if item.needs_sample:
                    items.append(item)
                    rows.append(logits[:, -1, :])
        if decode:
            logits = self._forward(decode, 1, self._decode_inputs(decode, pending))[:, -1, :]
            keep = [i for i, s in enumerate(decode) if s.needs_sample]
            items += [decode[i] for i in keep]
            if keep:  # mx.array([]) is float32, and a float index array fails the whole step
                rows.append(logits if len(keep) == len(decode) else logits[mx.array(keep, dtype=mx.int32)])
        for item in singles:
            logits = self._forward([item], item.num_new_tokens, self._chunk_tokens(item))
            if item.needs_sample:
                items.append(item)
                rows.append(logits[:, -1, :])
        logits = mx.concatenate(rows).astype(mx.float32) if rows else mx.zeros((0, 1))
        return StepLogits(items, logits)

    def _forward_pair(self, pair: tuple[ScheduledRequest, ScheduledRequest]) -> list[mx.array]:
        assert self.paired is not None and self.head is not None
        tokens = [self._chunk_tokens(item) for item in pair]
        caches = [self._caches([item], item.num_new_tokens, defer_writes=True) for item in pair]
        mx.synchronize()  # no matmul may run on the default stream while the thread count changes
        hidden = self.paired.hidden(tokens, caches)
        # The pools are written only now, from this thread's stream: two streams writing one pool
        # would each make the other's write copy it.
        for layer_caches in caches:
            for cache in layer_caches:
                cache.write_deferred()
        mx.async_eval(*self.storage.arrays())
        return [self.head(h[:, -1:, :]) for h in hidden]

    @staticmethod
    def _chunk_tokens(item: ScheduledRequest) -> mx.array:
        ids = item.request.all_token_ids[item.start : item.start + item.num_new_tokens]
        assert len(ids) == item.num_new_tokens, "only a decode row's input may be pending"
        return mx.array([ids], dtype=mx.int32)

    def _caches(
        self, chunk: list[ScheduledRequest], num_new: int, defer_writes: bool = False
    ) -> list[PagedLayerCache]:
        tables = [s.request.block_ids[: -(-(s.start + num_new) // self.block_size)] for s in chunk]
        starts = [s.start for s in chunk]
        layout = StepLayout(
            starts, num_new, tables, self.block_size, self.pool_tokens, self.cpu_math, defer_writes
        )
        return [PagedLayerCache(self.storage, i, layout) for i in range(len(self.storage.shapes))]

    @staticmethod
    def _decode_inputs(decode: list[ScheduledRequest], pending: DeviceTokens | None) -> mx.array:
        """(B, 1) input tokens: known ones from the requests, pending ones from the device."""
        known = [
            s.request.all_token_ids[s.start] if s.start < s.request.num_known_tokens else None for s in decode
        ]
        if all(t is not None for t in known):
            return mx.array(known, dtype=mx.int32)[:, None]
        assert pending is not None, "a pending input token needs the step that sampled it"
        rows = mx.array([pending.rows.get(s.request.request_id, 0) for s in decode], dtype=mx.int32)
        from_device = mx.take(pending.token_ids, rows)
        if all(t is None for t in known):
            return from_device[:, None]
        is_known = mx.array([t is not None for t in known])
        return mx.where(is_known, mx.array([t or 0 for t in known], dtype=mx.int32), from_device)[:, None]

    def _forward(self, chunk: list[ScheduledRequest], num_new: int, tokens: mx.array) -> mx.array:
        if num_new == 1 and self.cpu_decode is not None:
            tables = [s.request.block_ids[: -(-(s.start + 1) // self.block_size)] for s in chunk]
            ids = tokens[:, 0].tolist()  # known tokens: async scheduling is off on the CPU backend
            return self.cpu_decode.step(ids, [s.start for s in chunk], tables, self.storage)[:, None, :]
        if num_new == 1 and self.decode_graph is not None:
            tables = [s.request.block_ids[: -(-(s.start + 1) // self.block_size)] for s in chunk]
            logits = self.decode_graph(tokens[:, 0], [s.start for s in chunk], tables)[:, None, :]
        else:
            caches = self._caches(chunk, num_new)
            if num_new > 1 and self.head is not None:
                hidden = self.model.model(tokens, cache=caches)
                logits = self.head(hidden[:, -1:, :])
            else:
                logits = self.model(tokens, cache=caches, **model_inputs(self.model, chunk, tokens))
        # Launch each forward at once: the next one's scatter then finds the pools evaluated and
        # updates them in place, and the host goes on building while the device computes.
        to_eval = [logits] if chunk[0].needs_sample or num_new == 1 else []
        mx.async_eval(*to_eval, *self.storage.arrays())
        return logits


def pair_chunks(
    prefill: list[ScheduledRequest],
) -> tuple[list[tuple[ScheduledRequest, ScheduledRequest]], list[ScheduledRequest]]:
    """Longest first, each chunk with the next longest when within MIN_PAIR_RATIO of its length;
    (pairs, the chunks left over)."""
    left = sorted(prefill, key=lambda s: -s.num_new_tokens)
    pairs, singles = [], []
    while left:
        first = left.pop(0)
        if left and left[0].num_new_tokens >= MIN_PAIR_RATIO * first.num_new_tokens:
            pairs.append((first, left.pop(0)))
        else:
            singles.append(first)
    return pairs, singles
