"""Paged KV storage and the per-layer cache objects that plug it into mlx-lm models.

Owns the KV tensors on the MLX device (one K and one V pool per layer, shaped
(kv_heads, num_blocks, block_size, head_dim)). A block of one head is one contiguous row, so
the context gather is a row `take` straight into the (B, kv_heads, ctx, head_dim) layout
that attention wants, with no transpose copy). Never decides which blocks a request gets: the
model runner passes block tables that the scheduler's KV manager chose.

mlx-lm models call `cache.offset` (RoPE position), `cache.update_and_fetch(k, v)` and, through
`create_attention_mask`, `cache.make_mask(N)`. One forward covers B rows of L new tokens each:

    pool slot of token t of row b  = block_table[b][pos // block_size] * block_size + pos % block_size
    context of row b               = gather(block_table[b]) -> (ctx_len = max_blocks * block_size) slots
    mask[b, i, j]                  = j <= offset[b] + i   (and j > offset[b] + i - window, if windowed)
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.runner.cpu.window_attention import WindowPlan, plan_windows, window_attention

import mlx.core as mx


@dataclass(frozen=True)
class LayerShape:
    num_kv_heads: int
    k_head_dim: int
    v_head_dim: int


class KVStorage:
    def __init__(self, shapes: list[LayerShape], num_blocks: int, block_size: int, dtype: mx.Dtype):
        self.shapes = shapes
        self.num_blocks = num_blocks
        self.block_size = block_size
        # One block past the pool's: padding rows of a bucketed decode write there (engine/runner/cuda/decode_graph.py).
        self.scratch_block = num_blocks
        total = num_blocks + 1
        self.keys = [mx.zeros((s.num_kv_heads, total, block_size, s.k_head_dim), dtype) for s in shapes]
        self.values = [mx.zeros((s.num_kv_heads, total, block_size, s.v_head_dim), dtype) for s in shapes]
        mx.eval(self.keys, self.values)

    @staticmethod
    def bytes_per_block(shapes: list[LayerShape], block_size: int, dtype: mx.Dtype) -> int:
        per_token = sum(s.num_kv_heads * (s.k_head_dim + s.v_head_dim) for s in shapes)
        return per_token * block_size * dtype.size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def arrays(self) -> list[mx.array]:
        return self.keys + self.values


class StepLayout:
    """Where one forward call's tokens live: shared by every layer's cache in that call."""

    def __init__(
        self,
        offsets: list[int],
        num_new: int,
        block_tables: list[list[int]],
        block_size: int,
        pool_tokens: int | None = None,
        cpu_math: bool = False,
        defer_writes: bool = False,
    ):
        """`pool_tokens` (tokens per head in a pool) where attention may read the pools in place
        (engine/runner/cpu/window_attention.py; the model's attention is hooked), None to always gather.
        `cpu_math`: attention's softmax runs as engine/runner/cpu/cpu_math.py's (MLX's CPU backend)."""
        self.batch = len(offsets)
        self.cpu_math = cpu_math
        self.num_new = num_new
        self.block_size = block_size
        self._offsets = offsets
        # MLX's CPU backend lets a launch run ahead of the host by only a few operations, so one
        # launch per step leaves the device idle while Python builds the graph; a launch per layer
        # overlaps the two. A GPU queues whole graphs, so there one launch per step is best.
        self.launch_per_layer = mx.default_device().type == mx.DeviceType.cpu
        max_blocks = max(len(t) for t in block_tables)
        # One row needs no padding mask: its context is cut to exactly the tokens it has.
        self.ctx_len = offsets[0] + num_new if self.batch == 1 else max_blocks * block_size
        padded = [t + [0] * (max_blocks - len(t)) for t in block_tables]
        self.block_table = mx.array(padded, dtype=mx.int32)
        self.offset = offsets[0] if self.batch == 1 else mx.array(offsets, dtype=mx.int32)
        slots = self._slots(offsets, num_new, block_tables, block_size)
        self.write_slots = mx.array(slots, dtype=mx.int32)
        self._masks: dict[int | None, mx.array] = {}
        self._rows: dict[tuple[int, int], tuple[mx.array, mx.array]] = {}
        # Fast paths for one row: a slice write for one token, a slice read when its blocks are
        # consecutive ids (the usual case: the free queue hands out runs). Slices skip scatter/gather.
        table = block_tables[0]
        self.single_slot = divmod(slots[0], block_size) if len(slots) == 1 else None
        consecutive = self.batch == 1 and table == list(range(table[0], table[0] + len(table)))
        self.block_run = (table[0], len(table)) if consecutive else None
        # A prompt's first chunk with no cached prefix: its context is exactly its own new K/V.
        self.fresh = self.batch == 1 and offsets[0] == 0
        # One row that must not write the pools during its forward (engine/runner/cpu/paired_prefill.py: two
        # streams run at once): each layer's cache keeps its new K/V for `write_deferred`.
        assert not defer_writes or self.batch == 1
        self.defer_writes = defer_writes
        self.windows: WindowPlan | None = None
        if pool_tokens is not None and num_new == 1 and self.batch > 1:
            self.windows = plan_windows([o + 1 for o in offsets], block_tables, block_size, pool_tokens)
        self._window_index: dict[int, list[mx.array]] = {}

    def window_index(self, heads: int) -> list[mx.array]:
        assert self.windows is not None
        if heads not in self._window_index:
            self._window_index[heads] = self.windows.window_index(heads)
        return self._window_index[heads]

    def rows(self, heads: int, num_blocks: int) -> tuple[mx.array, mx.array]:
        """Row indices into a pool flattened head-major: token rows to write, block rows to read."""
        key = (heads, num_blocks)
        if key not in self._rows:
            head = mx.arange(heads, dtype=mx.int32)[:, None]
            write = head * (num_blocks * self.block_size) + self.write_slots[None, :]
            # Batch-major read order makes the gathered context (B, H, ctx, D) with no transpose.
            read = head[None] * num_blocks + self.block_table[:, None, :]
            self._rows[key] = (write.reshape(-1), read.reshape(-1))
        return self._rows[key]

    @staticmethod
    def _slots(offsets: list[int], num_new: int, tables: list[list[int]], block_size: int) -> list[int]:
        slots = []
        for offset, table in zip(offsets, tables):
            for pos in range(offset, offset + num_new):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        return slots

    def mask(self, window_size: int | None) -> mx.array | str | None:
        if self.batch == 1 and window_size is None:
            return "causal" if self.num_new > 1 else None
        if window_size not in self._masks:
            q_pos = mx.array(self._offsets, dtype=mx.int32)[:, None] + mx.arange(self.num_new)[None, :]
            k_pos = mx.arange(self.ctx_len)
            mask = k_pos[None, None, :] <= q_pos[:, :, None]
            if window_size is not None:
                mask = mask & (k_pos[None, None, :] > q_pos[:, :, None] - window_size)
            self._masks[window_size] = mask[:, None, :, :]
        return self._masks[window_size]


class PagedLayerCache:
    """mlx-lm's cache interface for one layer, backed by the shared paged storage."""

    def __init__(self, storage: KVStorage, layer: int, layout: StepLayout):
        self.storage = storage
        self.layer = layer
        self.layout = layout
        self._kept: tuple[mx.array, mx.array] | None = None  # K/V held back by `defer_writes`

    @property
    def offset(self) -> int | mx.array:
        return self.layout.offset

    @property
    def cpu_attention(self) -> bool:
        """True: the hooked attention over the context this cache returns runs engine/runner/cpu/cpu_math.py's.
        Prefill chunks only, where softmax covers L x S scores; a lone decode row (one query, and
        batched decode goes through window attention instead) keeps MLX's one-query kernel."""
        return self.layout.cpu_math and self.layout.num_new > 1

    @property
    def deferred(self) -> bool:
        """True when update_and_fetch hands back the pools: attention reads them in place."""
        return self.layout.windows is not None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.layout.launch_per_layer:
            # Start the device on everything up to this layer while Python builds the rest.
            mx.async_eval(keys, values)
        if self.layout.defer_writes:
            self._kept = (keys, values)
            if self.layout.fresh:
                return keys, values
            # The pools hold the cached prefix only: read it, then add the new K/V.
            prefix_len = self.layout.offset
            k_prefix = self._context(self.storage.keys[self.layer], prefix_len)
            v_prefix = self._context(self.storage.values[self.layer], prefix_len)
            return mx.concatenate([k_prefix, keys], axis=2), mx.concatenate([v_prefix, values], axis=2)
        k_pool, v_pool = self._write(self.storage.keys, keys), self._write(self.storage.values, values)
        if self.deferred:
            return k_pool, v_pool
        if self.layout.fresh:  # its context is exactly its new K/V: no need to read them back
            return keys, values
        return self._context(k_pool), self._context(v_pool)

    def paged_attention(
        self, queries: mx.array, k_pool: mx.array, v_pool: mx.array, scale: float
    ) -> mx.array:
        layout = self.layout
        assert layout.windows is not None
        index = layout.window_index(k_pool.shape[0])
        return window_attention(queries, k_pool, v_pool, layout.windows, index, scale, layout.cpu_math)

    def gather(self, k_pool: mx.array, v_pool: mx.array) -> tuple[mx.array, mx.array, mx.array | str | None]:
        return self._context(k_pool), self._context(v_pool), self.layout.mask(None)

    def _write(self, pools: list[mx.array], new: mx.array) -> mx.array:
        batch, heads, num_new, dim = new.shape
        pool = pools[self.layer]
        _, num_blocks, block_size, _ = pool.shape
        layout = self.layout
        if layout.single_slot is not None:
            block, slot = layout.single_slot
            pool[:, block, slot : slot + 1, :] = new[0]
        else:
            # Row views: one token's vector per written row.
            write_rows, _ = layout.rows(heads, num_blocks)
            flat = pool.reshape(heads * num_blocks * block_size, dim)
            flat[write_rows] = new.transpose(1, 0, 2, 3).reshape(heads * batch * num_new, dim)
            pool = flat.reshape(heads, num_blocks, block_size, dim)
        pools[self.layer] = pool
        return pool

    def write_deferred(self) -> None:
        """Writes the K/V that this layer's forward kept back (StepLayout's `defer_writes`)."""
        assert self._kept is not None, "update_and_fetch kept nothing back"
        (keys, values), self._kept = self._kept, None
        self._write(self.storage.keys, keys)
        self._write(self.storage.values, values)

    def _context(self, pool: mx.array, length: int | None = None) -> mx.array:
        """Each row's context (B, heads, ctx, dim); one row's is cut to `length` tokens (default:
        all it has, the new ones included)."""
        heads, num_blocks, block_size, dim = pool.shape
        layout = self.layout
        if layout.block_run is not None:
            first, count = layout.block_run
            context = pool[:, first : first + count].reshape(1, heads, count * block_size, dim)
        else:
            # One block of one head per row: `take` copies whole rows, batch-major.
            _, read_rows = layout.rows(heads, num_blocks)
            context = mx.take(pool.reshape(heads * num_blocks, block_size * dim), read_rows, axis=0)
            context = context.reshape(layout.batch, heads, -1, dim)
        if layout.batch > 1:
            return context
        return context[:, :, : (layout.ctx_len if length is None else length)]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        assert N == self.layout.num_new
        if self.deferred:  # window attention masks each row's windows itself
            assert window_size is None, "windows serve full attention only"
            return None
        return self.layout.mask(window_size)

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self) -> list[mx.array]:
        return [self.storage.keys[self.layer], self.storage.values[self.layer]]
