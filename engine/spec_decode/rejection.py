"""Verifies one request's drafted tokens against the model's logits at each drafted position.

Greedy rows keep drafts while they equal the argmax, so the output is exactly plain decoding's. Sampled
rows use speculative sampling's rejection rule (Leviathan et al. 2023, Chen et al. 2023): draft x, drawn
from q, is kept with probability min(1, p(x) / q(x)); the first rejected position draws from
max(0, p - q), renormalized. Every emitted token is then distributed exactly as p, the distribution
plain sampling draws from (engine/output/distribution.py). A deterministic drafter (n-gram lookup) has
q one-hot on its draft, so x is kept with probability p(x) and a rejection draws from p without x.

Owns this arithmetic only: no request state, no RNG (the caller passes the uniforms).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.output.distribution import probabilities
from engine.output.sampler import GREEDY_TEMPERATURE, SamplingRow

import numpy as np


@dataclass
class Drafts:
    token_ids: list[int]
    # The drafter's distribution at each draft, (k, vocab); None: each draft had probability 1.
    probs: np.ndarray | None = None


def verify(
    edited: np.ndarray, rows: list[SamplingRow], drafts: Drafts, accept_u: np.ndarray, draw_u: np.ndarray
) -> list[int]:
    """The tokens to emit: the accepted drafts, then one token the model chose (a correction, or a
    bonus when every draft was kept). `edited`: (k+1, vocab) logits after the sampler's edits, row j
    computed as if drafts[:j] were accepted (`rows[j]`); `accept_u` (k,) and `draw_u` (k+1,) uniforms."""
    k = len(drafts.token_ids)
    assert edited.shape[0] == len(rows) == k + 1
    if rows[0].params.temperature < GREEDY_TEMPERATURE:
        targets = edited.argmax(axis=-1)
        kept = 0
        while kept < k and targets[kept] == drafts.token_ids[kept]:
            kept += 1
        return drafts.token_ids[:kept] + [int(targets[kept])]
    p = probabilities(edited, rows)
    for j, token in enumerate(drafts.token_ids):
        q = drafts.probs[j] if drafts.probs is not None else _one_hot(token, p.shape[1])
        if accept_u[j] * q[token] < p[j, token]:
            continue
        residual = np.maximum(p[j] - q, 0.0)
        if residual.sum() <= 0.0:  # p <= q everywhere only when p == q: then nothing was to reject
            residual = p[j]
        return drafts.token_ids[:j] + [_draw(residual, draw_u[j])]
    return drafts.token_ids + [_draw(p[k], draw_u[k])]


def _one_hot(token: int, vocab: int) -> np.ndarray:
    q = np.zeros(vocab)
    q[token] = 1.0
    return q


def _draw(weights: np.ndarray, u: float) -> int:
    cdf = np.cumsum(weights)
    choice = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    choice = min(choice, len(weights) - 1)
    return choice if weights[choice] > 0 else int(weights.argmax())
