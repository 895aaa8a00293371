"""The per-layer cache objects that plug the paged KV storage (engine/runner/kv_storage.py) into mlx-lm
models, on any device.

Owns how one forward writes and reads the pools. A block of one head is one contiguous row, so the
context gather is a row `take` straight into the (B, kv_heads, ctx, head_dim) layout that attention
wants, with no transpose copy. A quantized storage (engine/runner/kv_quant.py) is written as codes,
scales and biases through the same slots and read back dequantized to the model dtype. Knows no device: a faster attention is handed in (`AttentionPaths`).
Never decides which blocks a request gets: the model runner passes block tables that the scheduler's
KV manager chose.

mlx-lm models call `cache.offset` (RoPE position), `cache.update_and_fetch(k, v)` and, through
`create_attention_mask`, `cache.make_mask(N)`. One forward covers B rows of L new tokens each:

    pool slot of token t of row b  = block_table[b][pos // block_size] * block_size + pos % block_size
    context of row b               = gather(block_table[b]) -> (ctx_len = max_blocks * block_size) slots
    mask[b, i, j]                  = j <= offset[b] + i   (and j > offset[b] + i - window, if windowed)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.runner.kv_storage import KVStorage, Side

import mlx.core as mx

Attention = Callable[[mx.array, mx.array, mx.array, float, Any], mx.array]  # (q, k, v, scale, mask)


class InPlaceAttention(Protocol):
    """Batched decode attention that reads K/V where they lie in the pools (a device's fast path)."""

    def plan(self, lengths: list[int], tables: list[list[int]], block_size: int) -> Any | None:
        """A plan for rows of `lengths` tokens (the new one included), or None: gather instead."""

    def attend(
        self, queries: mx.array, k_pool: mx.array, v_pool: mx.array, plan: Any, scale: float
    ) -> mx.array:
        """(B, heads, 1, D) queries over the pools, as the plan reads them."""


@dataclass(frozen=True)
class AttentionPaths:
    """What engine/runner/backends.py picked for the paged cache: the cache calls these and never asks
    which device it runs on. The defaults are the portable path: gather, MLX's attention."""

    in_place: InPlaceAttention | None = None  # batched decode reads the pools in place
    prefill_attention: Attention | None = None  # attention over a prefill chunk's gathered context
    launch_per_layer: bool = False  # launch each layer's K/V as it is built (a device that runs ahead little)


class StepLayout:
    """Where one forward call's tokens live: shared by every layer's cache in that call."""

    def __init__(
        self,
        offsets: list[int],
        num_new: int,
        block_tables: list[list[int]],
        block_size: int,
        paths: AttentionPaths = AttentionPaths(),
        defer_writes: bool = False,
        mask_ndim: int = 4,
    ):
        """`paths`: how attention runs (engine/runner/backends.py's choice for the model and device);
        `mask_ndim`: 5 where the model's scores carry a repeats axis (B, kv_heads, repeats, L, S), so a
        batched mask must be (B, 1, 1, L, S) to broadcast (engine/runner/layer_caches.py probes it)."""
        self.batch = len(offsets)
        self.mask_ndim = mask_ndim
        self.paths = paths
        self.num_new = num_new
        self.block_size = block_size
        self._offsets = offsets
        max_blocks = max(len(t) for t in block_tables)
        # One row needs no padding mask: its context is cut to exactly the tokens it has.
        self.ctx_len = offsets[0] + num_new if self.batch == 1 else max_blocks * block_size
        padded = [t + [0] * (max_blocks - len(t)) for t in block_tables]
        self.block_table = mx.array(padded, dtype=mx.int32)
        self.offset = offsets[0] if self.batch == 1 else mx.array(offsets, dtype=mx.int32)
        slots = self._slots(offsets, num_new, block_tables, block_size)
        self.write_slots = mx.array(slots, dtype=mx.int32)
        self._masks: dict[tuple[int | None, int | None], mx.array] = {}
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
        # Batched decode rows may read K/V in place, where the backend has such a path and the rows'
        # blocks suit it; None: every row's context is gathered through its block table.
        self.in_place_plan: Any | None = None
        if paths.in_place is not None and num_new == 1 and self.batch > 1:
            self.in_place_plan = paths.in_place.plan([o + 1 for o in offsets], block_tables, block_size)

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

    def mask(
        self, window_size: int | None, return_array: bool = False, retained: int | None = None
    ) -> mx.array | str | None:
        """As mlx-lm's caches answer `make_mask`: None for one row's one query over its whole context,
        "causal" for one row's chunk unless the model asks for an array, else the boolean array.
        `retained`: a RotatingKVCache's size where the model's mask window is wider: mlx-lm's cache then
        still holds only the last `retained` tokens before the chunk, so keys j <= offset - retained are
        out of reach too (plamo3 masks with its window + 1 over a cache of its window)."""
        if self.batch == 1 and window_size is None:
            if self.num_new == 1:
                return None
            if not return_array:
                return "causal"
        key = (window_size, retained)
        if key not in self._masks:
            offsets = mx.array(self._offsets, dtype=mx.int32)[:, None, None]
            q_pos = offsets[:, :, 0] + mx.arange(self.num_new)[None, :]
            k_pos = mx.arange(self.ctx_len)[None, None, :]
            mask = k_pos <= q_pos[:, :, None]
            if window_size is not None:
                mask = mask & (k_pos > q_pos[:, :, None] - window_size)
            if retained is not None:
                mask = mask & (k_pos > offsets - retained)
            self._masks[key] = mask[:, None, None] if self.mask_ndim == 5 else mask[:, None]
        return self._masks[key]


class PagedLayerCache:
    """mlx-lm's cache interface for one layer, backed by the shared paged storage."""

    # mlx-lm's ChunkedKVCache interface (llama4): the paged context always starts at token 0, and the
    # model's own chunk mask, built from these, covers it.
    start_position = 0

    def __init__(self, storage: KVStorage, layer: int, layout: StepLayout, window: int | None = None):
        """`window`: the layer attends to its last `window` tokens (the model's RotatingKVCache size),
        whether or not the model passes the window to its mask."""
        self.storage = storage
        self.layer = layer
        self.layout = layout
        self.window = window
        self._kept: tuple[mx.array, mx.array] | None = None  # K/V held back by `defer_writes`
        self._fetched: tuple[mx.array, mx.array] | None = None  # the context update_and_fetch returned

    @property
    def offset(self) -> int | mx.array:
        return self.layout.offset

    @property
    def context_attention(self) -> Attention | None:
        """The attention the hook runs over the context this cache returns, where the backend picked
        one: prefill chunks only, where softmax covers L x S scores; a lone decode row (one query) keeps
        MLX's one-query kernel, and batched decode rows read in place or gather."""
        return self.layout.paths.prefill_attention if self.layout.num_new > 1 else None

    @property
    def deferred(self) -> bool:
        """True when update_and_fetch hands back the pools: attention reads them in place."""
        return self.layout.in_place_plan is not None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.layout.paths.launch_per_layer:
            # Start the device on everything up to this layer while Python builds the rest.
            mx.async_eval(keys, values)
        if self.layout.defer_writes:
            self._kept = (keys, values)
            if not self.layout.fresh:
                # The pools hold the cached prefix only: read it, then add the new K/V.
                prefix_len = self.layout.offset
                assert isinstance(prefix_len, int), "deferred writes serve one row"
                k_prefix = self._context("keys", prefix_len)
                v_prefix = self._context("values", prefix_len)
                keys = mx.concatenate([k_prefix, keys], axis=2)
                values = mx.concatenate([v_prefix, values], axis=2)
            self._fetched = (keys, values)
            return keys, values
        self._write("keys", keys)
        self._write("values", values)
        if self.deferred:
            return self.keys, self.values
        # A fresh row's context is exactly its new K/V: no need to read back (with a quantized pool,
        # its own chunk then attends over unrounded K/V, as mlx-lm's plain cache would).
        if not self.layout.fresh:
            keys, values = self._context("keys"), self._context("values")
        self._fetched = (keys, values)
        return keys, values

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """The context K/V this step's update_and_fetch returned: layers that share another layer's KV
        (gemma3n, gemma4) read it here."""
        assert self._fetched is not None, "a shared-KV layer runs after the layer that writes its KV"
        return self._fetched

    def paged_attention(
        self, queries: mx.array, k_pool: mx.array, v_pool: mx.array, scale: float
    ) -> mx.array:
        layout = self.layout
        assert layout.paths.in_place is not None and layout.in_place_plan is not None
        return layout.paths.in_place.attend(queries, k_pool, v_pool, layout.in_place_plan, scale)

    def gather(self, k_pool: mx.array, v_pool: mx.array) -> tuple[mx.array, mx.array, mx.array | str | None]:
        return self._context("keys"), self._context("values"), self.layout.mask(None)

    def _write(self, side: Side, new: mx.array) -> None:
        """Writes this step's new K or V (B, heads, L, dim) into their slots: quantized first where the
        storage is, then each of the side's arrays (data, scales, biases) the same way."""
        if new.shape[-1] == 0:  # an empty V (minimax_m3's indexer keeps keys only): nothing to store
            return
        quant = self.storage.quant
        encoded = quant.encode(new) if quant is not None else (new,)
        for pools, part in zip(self.storage.side(side), encoded):
            pools[self.layer] = self._scatter(pools[self.layer], part)

    def _scatter(self, pool: mx.array, new: mx.array) -> mx.array:
        batch, heads, num_new, width = new.shape
        _, num_blocks, block_size, _ = pool.shape
        layout = self.layout
        if layout.single_slot is not None:
            block, slot = layout.single_slot
            pool[:, block, slot : slot + 1, :] = new[0]
            return pool
        # Row views: one token's vector per written row.
        write_rows, _ = layout.rows(heads, num_blocks)
        flat = pool.reshape(heads * num_blocks * block_size, width)
        flat[write_rows] = new.transpose(1, 0, 2, 3).reshape(heads * batch * num_new, width)
        return flat.reshape(heads, num_blocks, block_size, width)

    def write_deferred(self) -> None:
        """Writes the K/V that this layer's forward kept back (StepLayout's `defer_writes`)."""
        assert self._kept is not None, "update_and_fetch kept nothing back"
        (keys, values), self._kept = self._kept, None
        self._write("keys", keys)
        self._write("values", values)

    def _context(self, side: Side, length: int | None = None) -> mx.array:
        """Each row's context (B, heads, ctx, dim) in the model dtype; one row's is cut to `length`
        tokens (default: all it has, the new ones included). A quantized side is gathered as codes,
        scales and biases, then dequantized: the gather moves the small arrays."""
        parts = [pools[self.layer] for pools in self.storage.side(side)]
        heads, _, _, width = parts[0].shape
        layout = self.layout
        if width == 0:
            ctx_len = layout.ctx_len if layout.batch > 1 or length is None else length
            return mx.zeros((layout.batch, heads, ctx_len, 0), self.storage.dtype)
        gathered = [self._gather(part, length) for part in parts]
        quant = self.storage.quant
        return quant.decode(*gathered) if quant is not None else gathered[0]

    def _gather(self, pool: mx.array, length: int | None) -> mx.array:
        heads, num_blocks, block_size, width = pool.shape
        layout = self.layout
        if layout.block_run is not None:
            first, count = layout.block_run
            context = pool[:, first : first + count].reshape(1, heads, count * block_size, width)
        else:
            # One block of one head per row: `take` copies whole rows, batch-major.
            _, read_rows = layout.rows(heads, num_blocks)
            context = mx.take(pool.reshape(heads * num_blocks, block_size * width), read_rows, axis=0)
            context = context.reshape(layout.batch, heads, -1, width)
        if layout.batch > 1:
            return context
        return context[:, :, : (layout.ctx_len if length is None else length)]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        assert N == self.layout.num_new
        retained = self.window if window_size and self.window and window_size > self.window else None
        window_size = window_size or self.window
        if self.deferred:  # in-place attention masks each row's context itself
            assert window_size is None, "in-place attention serves full attention only"
            return None
        return self.layout.mask(window_size, return_array, retained)

    # Some models reassign a cache's `keys`/`values` to keep their own graphs bounded (deepseek_v32's
    # indexer: `cache.values = mx.zeros_like(cache.keys)`, `mx.depends`). Here the pools are written only
    # by update_and_fetch and the runner evaluates every pool each step, so such assignments are dropped.
    @property
    def keys(self) -> mx.array:
        return self.storage.keys[self.layer]

    @keys.setter
    def keys(self, _: mx.array) -> None:
        pass

    @property
    def values(self) -> mx.array:
        return self.storage.values[self.layer]

    @values.setter
    def values(self, _: mx.array) -> None:
        pass

    def maybe_trim_front(self) -> None:
        """ChunkedKVCache's: a paged context is never trimmed (the chunk mask hides older chunks)."""

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self) -> list[mx.array]:
        return [self.storage.keys[self.layer], self.storage.values[self.layer]]
