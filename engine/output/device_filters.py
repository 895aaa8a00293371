"""The device sampler's choice of each row's token (argmax, or the filters and draw: temperature, top_k,
top_p, min_p, inverse CDF) and its top-N logprob selection, in MLX ops over a batch of rows. No state; nothing here reads an array back.

Filters reduce to per-row thresholds on the weights exp((x - max) / T), so every row draws in vocabulary
order from one uniform, like the host's rows without top_k; the host draws top_k rows in rank order, so
their token for a given uniform differs while their distribution is the same.
"""

from __future__ import annotations

from engine.output.sampler import GREEDY_TEMPERATURE, SamplingRow

import mlx.core as mx
import numpy as np

_BLOCK = 128  # the draw picks a block of this many tokens by block sums, then a token inside it


def take_rows(x: mx.array, rows: list[int]) -> mx.array:
    """x[rows], without a copy when `rows` is every row in order."""
    return x if len(rows) == x.shape[0] else x[mx.array(rows, dtype=mx.int32)]


def choose_tokens(edited: mx.array, rows: list[SamplingRow], uniforms: np.ndarray) -> mx.array:
    """(B,) int32: argmax for greedy rows, a draw for the others. The argmax runs over every row: one
    pass, cheaper than gathering the greedy rows first."""
    drawing = [i for i, row in enumerate(rows) if row.params.temperature >= GREEDY_TEMPERATURE]
    if not drawing:
        return mx.argmax(edited, axis=-1).astype(mx.int32)
    drawn = draw_random(take_rows(edited, drawing), [rows[i] for i in drawing], uniforms[drawing])
    if len(drawing) == len(rows):
        return drawn
    greedy = mx.argmax(edited, axis=-1).astype(mx.int32)
    return mx.put_along_axis(greedy, mx.array(drawing, dtype=mx.int32), drawn, axis=0)


def draw_random(logits: mx.array, rows: list[SamplingRow], uniforms: np.ndarray) -> mx.array:
    """(R,) int32: temperature, top_k, top_p and min_p, then one draw per row of (R, vocab) `logits`."""
    inv_temp = mx.array([1.0 / r.params.temperature for r in rows], dtype=mx.float32)[:, None]
    weights = mx.exp((logits - logits.max(axis=-1, keepdims=True)) * inv_temp)  # the best token weighs 1
    keep = _kept(weights, rows)
    if keep is not None:
        weights = mx.where(keep, weights, 0.0)
    return _draw(weights, mx.array(uniforms, dtype=mx.float32))


def _kept(weights: mx.array, rows: list[SamplingRow]) -> mx.array | None:
    """(R, vocab) bool of the tokens the filters keep, or None when no row filters."""
    vocab = weights.shape[1]
    ranked = [i for i, r in enumerate(rows) if _top_k(r, vocab) < vocab or r.params.top_p < 1.0]
    keep = None
    if ranked:
        keep = _rank_cut(take_rows(weights, ranked), [rows[i] for i in ranked])
        if len(ranked) < len(rows):  # unranked rows pick a last row that keeps everything
            pick = np.full(len(rows), len(ranked), dtype=np.int32)
            pick[ranked] = np.arange(len(ranked))
            keep = mx.concatenate([keep, mx.ones((1, vocab), dtype=mx.bool_)])[mx.array(pick)]
    min_p = np.array([r.params.min_p for r in rows], dtype=np.float32)
    if (min_p > 0).any():  # min_p keeps weights >= min_p times the best one's, which is 1
        above = weights >= mx.array(min_p)[:, None]
        keep = above if keep is None else keep & above
    return keep


def _top_k(row: SamplingRow, vocab: int) -> int:
    top_k = row.params.top_k
    return vocab if top_k is None else min(top_k, vocab)


def _rank_cut(weights: mx.array, rows: list[SamplingRow]) -> mx.array:
    """(F, vocab) bool: what top_k and top_p keep of rows that set either.

    One descending sort of the rows' weights gives each row's cut: the smallest kept weight, and how many
    tokens rank above it. A sort is one op; a threshold search needs two passes per bisection step (~50
    ops for float32's precision), and the host's try-a-few-widths trick needs a read to decide. Ranking
    by weight ranks by logit (exp keeps the order); logits a float32 ulp apart may tie as weights, which
    only moves a top_k boundary between two tokens of the same weight."""
    vocab = weights.shape[1]
    k = np.array([_top_k(r, vocab) for r in rows], dtype=np.int32)
    top_p = np.array([r.params.top_p for r in rows], dtype=np.float32)
    desc = mx.sort(weights, axis=-1)[:, ::-1]
    in_k = mx.arange(vocab)[None, :] < mx.array(k)[:, None] if (k < vocab).any() else None
    candidates = desc if in_k is None else mx.where(in_k, desc, 0.0)
    # Keep a token while the mass ranked above it is below top_p of the candidates' (at least one stays).
    cumulative = mx.cumsum(candidates, axis=-1)
    nucleus = (cumulative - candidates) < mx.array(top_p)[:, None] * cumulative[:, -1:]
    nucleus = nucleus if in_k is None else nucleus & in_k
    num_kept = mx.where(mx.array(top_p < 1.0), nucleus.sum(axis=-1), mx.array(k))
    cutoff = mx.take_along_axis(desc, (num_kept - 1)[:, None], axis=-1)
    if in_k is None:
        return weights >= cutoff  # ties at the cut-off are all kept, as the host's nucleus cut-off
    # top_k rows keep exactly num_kept tokens, ties broken by ascending id as the host's rank order;
    # other rows keep every tie (num_kept is raised to vocab for them).
    above = weights > cutoff
    tied = weights == cutoff
    room = mx.where(mx.array(k < vocab), num_kept, vocab)[:, None] - above.sum(axis=-1, keepdims=True)
    return above | (tied & (mx.cumsum(tied.astype(mx.int32), axis=-1) <= room))


def _draw(weights: mx.array, uniforms: mx.array) -> mx.array:
    """Inverse-CDF draw per row from unnormalized weights, in vocabulary order: a block by block sums,
    then a token inside it. Two float32 prefix sums of ~1k and 128 entries keep the precision a single
    float32 prefix sum over 128k tokens would lose (a long tail's small weights are absorbed)."""
    num_rows, vocab = weights.shape
    pad = -vocab % _BLOCK
    blocks = (mx.pad(weights, [(0, 0), (0, pad)]) if pad else weights).reshape(num_rows, -1, _BLOCK)
    mass = blocks.sum(axis=-1)
    cdf = mx.cumsum(mass, axis=-1)
    target = uniforms * cdf[:, -1]
    block = mx.minimum((cdf <= target[:, None]).sum(axis=-1), cdf.shape[1] - 1)[:, None]
    before = mx.take_along_axis(cdf, block, axis=-1) - mx.take_along_axis(mass, block, axis=-1)
    inner_weights = mx.take_along_axis(blocks, block[:, :, None], axis=1)[:, 0, :]
    inner_cdf = mx.cumsum(inner_weights, axis=-1)
    inner = mx.minimum((inner_cdf <= target[:, None] - before).sum(axis=-1), _BLOCK - 1)[:, None]
    choice = (block * _BLOCK + inner)[:, 0]
    # Rounding can land on a zero weight (probability ~1e-7); take the row's best token then, as the host.
    landed = mx.take_along_axis(inner_weights, inner, axis=-1)[:, 0] > 0
    return mx.where(landed, choice, mx.argmax(weights, axis=-1)).astype(mx.int32)


def top_n(x: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """Ids (int32) and values of each row's n largest entries, best first, ties by ascending id: the
    host's order, exact even where the n-th value is tied (grammar-masked -inf, bfloat16 logits)."""
    n = min(n, x.shape[1])
    if n == 0:
        return mx.zeros((x.shape[0], 0), dtype=mx.int32), mx.zeros((x.shape[0], 0), dtype=x.dtype)
    nth = mx.topk(x, n, axis=-1).min(axis=-1, keepdims=True)
    above = x > nth
    tied = x == nth
    room = n - above.sum(axis=-1, keepdims=True)
    chosen = above | (tied & (mx.cumsum(tied.astype(mx.int32), axis=-1) <= room))  # exactly n per row
    ids = mx.argpartition(mx.where(chosen, 0, 1), n - 1, axis=-1)[:, :n].astype(mx.int32)
    values = mx.take_along_axis(x, ids, axis=-1)
    # n <= 20: each entry's rank is how many of the n come before it, from an (R, n, n) comparison.
    v_i, v_j, id_i, id_j = values[:, :, None], values[:, None, :], ids[:, :, None], ids[:, None, :]
    rank = ((v_j > v_i) | ((v_j == v_i) & (id_j < id_i))).sum(axis=-1)
    order = mx.argsort(rank, axis=-1)
    return mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(values, order, axis=-1)
