"""The probability distribution the sampler draws a row's token from, as a whole vector: what speculative
decoding's rejection sampling compares a draft against (engine/spec_decode/rejection.py).

Owns no state; mirrors engine/output/sampler.py's math step for step (logit_bias, min_tokens, penalties,
temperature, then top_k, top_p and min_p as the sampler applies them), so that a token accepted or
resampled here has exactly the probability the sampler would have given it.
"""

from __future__ import annotations

from engine.output.sampler import (
    GREEDY_TEMPERATURE,
    SamplingRow,
    _edit_logits,
    _filter_sorted,
    _nucleus_cutoff,
    _top_k,
)

import numpy as np


def edited_logits(raw: np.ndarray, rows: list[SamplingRow]) -> np.ndarray:
    """The logits after logit_bias, the min_tokens mask and penalties (a copy where any applies)."""
    return _edit_logits(raw, rows)


def probabilities(edited: np.ndarray, rows: list[SamplingRow]) -> np.ndarray:
    """(B, vocab) float64 probabilities of sampled rows (temperature > 0), each summing to 1."""
    assert all(row.params.temperature >= GREEDY_TEMPERATURE for row in rows)
    out = np.zeros(edited.shape, dtype=np.float64)
    for i, row in enumerate(rows):
        out[i] = _row_probabilities(edited[i : i + 1], row)
    return out


def _row_probabilities(logits: np.ndarray, row: SamplingRow) -> np.ndarray:
    p = row.params
    inv_temp = np.float32(1.0 / p.temperature)
    top_p, min_p = np.array([p.top_p]), np.array([p.min_p], dtype=np.float32)
    vocab = logits.shape[1]
    weights = np.zeros(vocab, dtype=np.float64)
    if p.top_k is not None and p.top_k < vocab:
        ids, vals = _top_k(logits, p.top_k)
        kept = _filter_sorted(np.exp((vals - vals[:, :1]) * inv_temp), top_p, min_p)
        valid = ids[0] < vocab
        weights[ids[0][valid]] = kept[0][valid]
    else:
        w = np.exp((logits - logits.max(axis=-1, keepdims=True)) * inv_temp)
        cutoff = min_p
        if p.top_p < 1.0:
            cutoff = np.maximum(cutoff, _nucleus_cutoff(w, top_p))
        if cutoff[0] > 0:
            w = w * (w >= cutoff[:, None])
        weights[:] = w[0]
    return weights / weights.sum()
