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

from dataclasses import dataclass

from engine.runner.cpu import cpu_math

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

    def window_index(self, num_kv_heads: int) -> list[mx.array]:
        """Per slot, the window of each (b, h), ordered b-major: (B * KVH,) uint32."""
        heads = np.arange(num_kv_heads)[None, :] * self.pool_tokens
        return [
            mx.array((self.firsts[:, [s]] + heads).reshape(-1).astype(np.uint32))
            for s in range(len(self.widths))
        ]


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
    scores = []
    for width, windows in zip(plan.widths, index):
        k_win = mx.as_strided(k_pool, (flat_tokens - width + 1, dim, width), (dim, 1, dim))  # K^T windows
        scores.append(mx.gather_mm(q, k_win, rows, windows))  # (B*KVH, REP, W_s)
    scores = mx.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]
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
