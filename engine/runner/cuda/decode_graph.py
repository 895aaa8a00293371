"""A compiled decode forward with bucketed shapes, for GPUs: one traced graph per (batch, context) bucket.

Owns only the compiled function and the bucket arithmetic; the KV pools stay in `KVStorage` and
pass through the graph as inputs and outputs, so each step's scatter updates them in place (the
old pools are dropped before the graph runs). Never chooses blocks: it receives block tables.

A step of B rows, each with one new token, runs padded to the bucket shapes:

    rows      B -> B_pad  = next power of two      (padding rows: offset 0, every block the scratch block)
    blocks    n -> n_pad  = next power of two      (padding entries: the scratch block, masked out)
    write     slot of row b = table[b][offset_b // block_size] * block_size + offset_b % block_size
    mask      key j of row b is visible iff j <= offset_b

so a new batch size or a longer context reuses a graph already traced for its bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engine.runner import attention_hook
from engine.runner.cuda import cuda_attention
from engine.runner.cuda.fused_projections import fuse_gate_up
from engine.runner.cuda.quantized_rows import QuantizedRowsUse
from engine.runner.cuda.small_matmul import use_small_rows_kernel
from engine.runner.fast_path import Target, cache_refusal, quantized_kv_refusal
from engine.runner.kv_storage import KVStorage

import mlx.core as mx
import numpy as np
from mlx import nn


class CudaGraphDecode:
    """The plug-in (engine/runner/fast_path.py) for MLX's CUDA backend: paged attention kernel, fused
    gate/up, few-row matmul kernel, compiled bucketed graph."""

    name = "cuda_graph"
    role = "decode"
    setting = "cuda_graph"
    devices: tuple[str, ...] = ("gpu",)

    def applies(self, target: Target) -> str | None:
        if target.device != "gpu" or not cuda_attention.kernel_available():
            return "needs MLX's CUDA backend"
        if getattr(target.model, "mrope", False):
            return "M-RoPE rows need explicit positions; the graph places rows at 1-D cache offsets"
        storage = target.storage
        quantized = quantized_kv_refusal(storage, "the paged attention kernel")
        if quantized is not None:
            return quantized
        head_dims = [(s.k_head_dim, s.v_head_dim) for s in storage.shapes]
        if not all(k == v and cuda_attention.supports(k, storage.keys[0].dtype) for k, v in head_dims):
            return "the kernel needs equal K and V head dims, a multiple of 32 up to 256"
        return cache_refusal(target.model)  # the kernel masks causally over every past token

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[DecodeGraph | None, str | None]:
        refusal = attention_hook.pool_refusal(target.model)
        if refusal is not None:
            return None, refusal
        rows = QuantizedRowsUse(target.quantized_rows)
        fuse_gate_up(target.model, rows)
        use_small_rows_kernel(target.model)
        rows.rewrite(target.model)
        graph = DecodeGraph(target.model, target.storage, use_kernel=True)
        graph.quantized_rows = rows.summary
        return graph, None


def bucket(n: int) -> int:
    """The next power of two at or above n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def padded_layout(
    offsets: list[int], tables: list[list[int]], padded: int, block_size: int, scratch_block: int
) -> tuple[mx.array, mx.array, mx.array]:
    """The bucketed step's (table, offsets, slots), padding rows and entries on the scratch block (module map)."""
    width = bucket(max(len(t) for t in tables))
    table = np.full((padded, width), scratch_block, dtype=np.int32)
    for row, blocks in zip(table, tables):
        row[: len(blocks)] = blocks
    offs = np.zeros(padded, dtype=np.int32)
    offs[: len(offsets)] = offsets
    slots = table[np.arange(padded), offs // block_size] * block_size + offs % block_size
    return mx.array(table), mx.array(offs), mx.array(slots.astype(np.int32))


def bucketed_step(
    compiled: Callable[..., list[mx.array]],
    storage: KVStorage,
    tokens: mx.array,
    offsets: list[int],
    tables: list[list[int]],
) -> mx.array:
    """Runs `compiled(tokens, offsets, table, slots, *pools) -> [logits, *keys, *values]` on B rows padded
    to the bucket shapes (module map), installs the pools it returns and gives the B rows' lazy logits."""
    batch = len(offsets)
    padded = bucket(batch)
    table, offs, slots = padded_layout(offsets, tables, padded, storage.block_size, storage.scratch_block)
    if padded > batch:
        tokens = mx.concatenate([tokens, mx.zeros((padded - batch,), mx.int32)])
    pools = storage.arrays()
    storage.keys.clear()
    storage.values.clear()
    logits, *new_pools = compiled(tokens, offs, table, slots, *pools)
    del pools  # the graph holds the only reference, so scatters into the pools run in place
    num_layers = len(new_pools) // 2
    storage.keys.extend(new_pools[:num_layers])
    storage.values.extend(new_pools[num_layers:])
    return logits[:batch] if padded > batch else logits


class _GraphLayerCache:
    """mlx-lm's cache interface for one layer inside the traced graph; every index is an array."""

    def __init__(self, keys: mx.array, values: mx.array, step: _StepArrays):
        self.keys, self.values, self.step = keys, values, step

    @property
    def offset(self) -> mx.array:
        return self.step.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys, k_ctx = self._update(self.keys, keys)
        self.values, v_ctx = self._update(self.values, values)
        return k_ctx, v_ctx

    @property
    def deferred(self) -> bool:
        """With the kernel, update_and_fetch hands back the pools (engine/runner/attention_hook.py)."""
        return self.step.use_kernel

    def paged_attention(
        self, queries: mx.array, k_pool: mx.array, v_pool: mx.array, scale: float
    ) -> mx.array:
        step = self.step
        return cuda_attention.paged_decode_attention(queries, k_pool, v_pool, step.table, step.lengths, scale)

    def gather(self, k_pool: mx.array, v_pool: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return self._context(k_pool), self._context(v_pool), self._mask(None)

    def _update(self, pool: mx.array, new: mx.array) -> tuple[mx.array, mx.array]:
        heads, num_blocks, block_size, dim = pool.shape
        batch = new.shape[0]
        write, _ = self.step.rows(heads, num_blocks)
        flat = pool.reshape(heads * num_blocks * block_size, dim)
        flat[write] = new.transpose(1, 0, 2, 3).reshape(heads * batch, dim)
        pool = flat.reshape(heads, num_blocks, block_size, dim)
        return pool, pool if self.deferred else self._context(pool)

    def _context(self, pool: mx.array) -> mx.array:
        heads, num_blocks, block_size, dim = pool.shape
        _, read = self.step.rows(heads, num_blocks)
        context = mx.take(pool.reshape(heads * num_blocks, block_size * dim), read, axis=0)
        return context.reshape(self.step.table.shape[0], heads, -1, dim)

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | None:
        assert N == 1
        if self.deferred:
            assert window_size is None, "the decode kernel serves full attention only"
            return None
        return self._mask(window_size)

    def _mask(self, window_size: int | None) -> mx.array:
        step = self.step
        k_pos = mx.arange(step.table.shape[1] * step.block_size, dtype=mx.int32)
        mask = k_pos[None, :] <= step.offsets[:, None]
        if window_size is not None:
            mask = mask & (k_pos[None, :] > step.offsets[:, None] - window_size)
        return mask[:, None, None, :]

    def is_trimmable(self) -> bool:
        return False


class _StepArrays:
    def __init__(
        self, offsets: mx.array, table: mx.array, slots: mx.array, block_size: int, use_kernel: bool
    ):
        self.offsets, self.table, self.slots, self.block_size = offsets, table, slots, block_size
        self.use_kernel = use_kernel
        self.lengths = offsets + 1
        self._rows: dict[tuple[int, int], tuple[mx.array, mx.array]] = {}

    def rows(self, heads: int, num_blocks: int) -> tuple[mx.array, mx.array]:
        """Rows of a pool flattened head-major, built once per step and shared by every layer:
        token rows to write, whole-block rows to read (batch-major, so the context needs no transpose)."""
        if (heads, num_blocks) not in self._rows:
            head = mx.arange(heads, dtype=mx.int32)
            write = head[:, None] * (num_blocks * self.block_size) + self.slots[None, :]
            read = head[None, :, None] * num_blocks + self.table[:, None, :]
            self._rows[(heads, num_blocks)] = (write.reshape(-1), read.reshape(-1))
        return self._rows[(heads, num_blocks)]


class DecodeGraph:
    """Runs B single-token rows through the model as one compiled, padded forward."""

    def __init__(self, model: nn.Module, storage: KVStorage, use_kernel: bool = False):
        self.model = model
        self.use_kernel = use_kernel
        self.storage = storage
        self.block_size = storage.block_size
        self.num_layers = len(storage.shapes)
        self.quantized_rows = "off"  # what the 4-bit rows kernel serves (quantized_rows.py), for /v1/status
        self._compiled = mx.compile(self._forward)

    def step(self, tokens: mx.array, offsets: list[int], tables: list[list[int]]) -> mx.array:
        """tokens (B,) int32 (may be lazy); returns lazy logits (B, vocab) and installs the new pools."""
        return bucketed_step(self._compiled, self.storage, tokens, offsets, tables)

    def _forward(self, tokens, offsets, table, slots, *pools):
        step = _StepArrays(offsets, table, slots, self.block_size, self.use_kernel)
        n = self.num_layers
        caches = [_GraphLayerCache(pools[i], pools[n + i], step) for i in range(n)]
        logits = self.model(tokens[:, None], cache=caches)[:, -1, :]
        return [logits, *(c.keys for c in caches), *(c.values for c in caches)]
