"""Decode attention that reads K/V where they lie in the paged pools, through windows over runs of
consecutive blocks. Owns the window plan of one decode step and the attention over it; never
writes the pools (the cache writes the new tokens first) and never chooses blocks.

Why: a block-table gather copies every row's context (one read, one write) before attention reads
it again, three passes over the KV where mlx-lm's contiguous cache needs one; on a CPU, memory
bandwidth bounds decode attention, so the gather costs as much as the attention. The blocks of a
run of consecutive ids are one contiguous span of tokens per head, and `mx.gather_mm` over an
`as_strided` view of overlapping windows multiplies the queries against that span in place.

A pool (KVH, num_blocks, BS, D), seen flat as KVH * NT tokens (NT = num_blocks * BS):

    segment (b, s)     the s-th run of row b's table: tokens [start, start + len), start = first block * BS
    slot s             the s-th segments of all rows, read through windows of width W_s = their longest
    window i (slot s)  flat tokens [i, i + W_s); windows overlap, nothing is copied
    window of (b,s,h)  h * NT + start - shift, shift = max(0, start + W_s - NT)   (never past the pool's end)
    visible            window positions [shift, shift + len); a row with fewer runs gets empty segments
    scores             (B * KVH, REP, W_0 + ... + W_{S-1}), one softmax per row over all its slots
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.runner import attention_hook
from engine.runner.cpu import cpu_math
from engine.runner.fast_path import Target, cache_refusal, quantized_kv_refusal

import mlx.core as mx
import numpy as np

# Windows read the sum of the slots' widths per row; the gather path reads and writes the padded
# context and attention reads it again. Measured in the engine at 32 rows of ~330 tokens, windows
# that read 1.7 times the context were already slower than the gather (bench/engine.py --attention-ab).
MAX_READ_RATIO = 1.3


@dataclass(frozen=True)
class WindowPlan:
    widths: list[int]  # W_s per slot
    firsts: np.ndarray  # (B, S) window start of each segment, flat within one head (shift applied)
    pool_tokens: int  # NT
    visible: mx.array  # (B, 1, 1, sum of widths) bool
    _index: dict[int, list[mx.array]] = field(default_factory=dict, compare=False)  # per KVH, built once

    def window_index(self, num_kv_heads: int) -> list[mx.array]:
        """Per slot, the window of each (b, h), ordered b-major: (B * KVH,) uint32; every layer of a
        step with these heads shares it."""
        if num_kv_heads not in self._index:
            heads = np.arange(num_kv_heads)[None, :] * self.pool_tokens
            self._index[num_kv_heads] = [
                mx.array((self.firsts[:, [s]] + heads).reshape(-1).astype(np.uint32))
                for s in range(len(self.widths))
            ]
        return self._index[num_kv_heads]


class WindowedAttention:
    """engine/runner/paged_attention.py's InPlaceAttention through windows over runs of blocks."""

    def __init__(self, pool_tokens: int, cpu_softmax: bool):
        self.pool_tokens = pool_tokens  # NT: tokens per head in a pool
        self.cpu_softmax = cpu_softmax  # engine/runner/cpu/cpu_math.py's softmax

    def plan(self, lengths: list[int], tables: list[list[int]], block_size: int) -> WindowPlan | None:
        return plan_windows(lengths, tables, block_size, self.pool_tokens)

    def attend(
        self, queries: mx.array, k_pool: mx.array, v_pool: mx.array, plan: WindowPlan, scale: float
    ) -> mx.array:
        index = plan.window_index(k_pool.shape[0])
        return window_attention(queries, k_pool, v_pool, plan, index, scale, self.cpu_softmax)


class InPlaceWindows:
    """The plug-in (engine/runner/fast_path.py): batched decode attention reads K/V in place. On by
    default on the CPU, where memory bandwidth bounds decode attention (not measured on Metal)."""

    name = "window_attention"
    role = "attention"
    setting = "kv_in_place"
    devices: tuple[str, ...] = ("cpu",)

    def applies(self, target: Target) -> str | None:
        # Its windows multiply queries against the pools in place: codes would need dequantizing first.
        quantized = quantized_kv_refusal(target.storage, "gather_mm over the pools")
        return quantized or cache_refusal(target.model)  # its windows cover every past token of a row

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[WindowedAttention | None, str | None]:
        refusal = attention_hook.pool_refusal(target.model)
        if refusal is not None:
            return None, refusal
        storage = target.storage
        pool_tokens = storage.keys[0].shape[1] * storage.block_size
        return WindowedAttention(pool_tokens, picked.get("math") == "cpu_math"), None


def runs(table: list[int]) -> list[tuple[int, int]]:
    """(first block, number of blocks) for each run of consecutive ids in a block table."""
    out: list[tuple[int, int]] = []
    for block in table:
        if out and block == out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((block, 1))
    return out


def plan_windows(
    lengths: list[int], tables: list[list[int]], block_size: int, pool_tokens: int
) -> WindowPlan | None:
    """The windows for decode rows of `lengths` tokens (the new one included), or None where the
    rows' blocks are too scattered for windows to read less than the gather path."""
    segments: list[list[tuple[int, int]]] = []  # per row: (start token, length)
    for length, table in zip(lengths, tables):
        spans, left = [], length
        for first, count in runs(table):
            spans.append((first * block_size, min(count * block_size, left)))
            left -= spans[-1][1]
        # Longest first: a slot is as wide as its longest segment, and rows whose context breaks at
        # different places then still share narrow slots (attention does not depend on key order).
        segments.append(sorted((s for s in spans if s[1] > 0), key=lambda s: -s[1]))
    num_slots = max(len(spans) for spans in segments)
    widths = [max(spans[s][1] for spans in segments if s < len(spans)) for s in range(num_slots)]
    context = max(len(t) for t in tables) * block_size
    if sum(widths) > MAX_READ_RATIO * context or max(widths) > pool_tokens:
        return None
    firsts = np.zeros((len(lengths), num_slots), dtype=np.int64)
    visible = np.zeros((len(lengths), sum(widths)), dtype=bool)
    offsets = np.cumsum([0] + widths)
    for b, spans in enumerate(segments):
        for s, (start, n) in enumerate(spans):
            shift = max(0, start + widths[s] - pool_tokens)
            firsts[b, s] = start - shift
            visible[b, offsets[s] + shift : offsets[s] + shift + n] = True
    mask = mx.array(visible.reshape(len(lengths), 1, 1, -1))
    return WindowPlan(widths, firsts, pool_tokens, mask)


def window_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    plan: WindowPlan,
    index: list[mx.array],
    scale: float,
    cpu_softmax: bool = False,
) -> mx.array:
    """queries (B, NQ, 1, D); pools (KVH, num_blocks, BS, D), row-contiguous; `index` from
    `plan.window_index`; `cpu_softmax`: engine/runner/cpu/cpu_math.py's softmax. Returns (B, NQ, 1, Dv)."""
    batch, num_q, _, dim = queries.shape
    num_kv, num_blocks, block_size, _ = k_pool.shape
    v_dim = v_pool.shape[-1]
    flat_tokens = num_kv * num_blocks * block_size
    rows = mx.arange(batch * num_kv, dtype=mx.uint32)
    q = (queries * scale).reshape(batch * num_kv, num_q // num_kv, dim)
    per_slot = []
    for width, windows in zip(plan.widths, index):
        k_win = mx.as_strided(k_pool, (flat_tokens - width + 1, dim, width), (dim, 1, dim))  # K^T windows
        per_slot.append(mx.gather_mm(q, k_win, rows, windows))  # (B*KVH, REP, W_s)
    scores = mx.concatenate(per_slot, axis=-1) if len(per_slot) > 1 else per_slot[0]
    scores = scores.reshape(batch, num_kv, num_q // num_kv, -1)
    scores = mx.where(plan.visible, scores, mx.array(-float("inf"), scores.dtype))
    probs = cpu_math.softmax(scores) if cpu_softmax else mx.softmax(scores, axis=-1, precise=True)
    probs = probs.reshape(batch * num_kv, num_q // num_kv, -1)
    out, offset = None, 0
    for width, windows in zip(plan.widths, index):
        v_win = mx.as_strided(v_pool, (flat_tokens - width + 1, width, v_dim), (v_dim, v_dim, 1))
        part = mx.gather_mm(probs[..., offset : offset + width], v_win, rows, windows)  # (B*KVH, REP, Dv)
        out = part if out is None else out + part
        offset += width
    assert out is not None
    return out.reshape(batch, num_q, 1, v_dim)
