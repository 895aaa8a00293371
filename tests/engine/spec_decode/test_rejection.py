"""Rejection sampling keeps the model's distribution, measured: many verifications of fixed logits against
drafts from another distribution, and the emitted tokens' frequencies against the model's probabilities."""

from engine.messages import SamplingParams
from engine.output.distribution import probabilities
from engine.output.sampler import Sampler, SamplingRow
from engine.spec_decode.ngram import propose_ngram
from engine.spec_decode.rejection import Drafts, verify

import mlx.core as mx
import numpy as np
import pytest

VOCAB = 6
TRIALS = 20000


def _rows(params: SamplingParams, k: int) -> list[SamplingRow]:
    return [SamplingRow(params, [1], [9] * j) for j in range(k + 1)]


def _tv(counts: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_emitted_tokens_follow_the_model_distribution_not_the_drafts(drafter):
    rng = np.random.default_rng(0)
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], dtype=np.float32))
    q = np.array([0.05, 0.05, 0.1, 0.2, 0.3, 0.3])  # the drafter favours what the model does not
    params = SamplingParams(temperature=1.0)
    k = 2
    rows = _rows(params, k)
    edited = np.tile(logits, (k + 1, 1))
    p = probabilities(edited[:1], rows[:1])[0]
    first, second = np.zeros(VOCAB), np.zeros(VOCAB)
    num_accepted = 0
    for _ in range(TRIALS):
        tokens = rng.choice(VOCAB, size=k, p=q)
        probs = np.tile(q, (k, 1)) if drafter == "draft_model" else None
        out = verify(edited, rows, Drafts(tokens.tolist(), probs), rng.random(k), rng.random(k + 1))
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
        num_accepted += len(out) - 1
    # Every position is drawn from p, as plain sampling would: within sampling noise (~0.01 at 20k).
    print(f"{drafter}: TV(first, p) {_tv(first, p):.4f}, TV(second, p) {_tv(second, p):.4f}")
    assert _tv(first, p) < 0.02
    assert _tv(second, p) < 0.03
    assert _tv(first, q) > 0.3  # the drafts alone would be far off: the test can tell
    if drafter == "draft_model":  # acceptance sum(min(p, q)) per position
        expected = np.minimum(p, q).sum()
        assert abs(num_accepted / TRIALS - (expected + expected**2)) < 0.03


def test_greedy_keeps_drafts_while_they_are_the_argmax_then_corrects():
    logits = np.full((4, VOCAB), -5.0, dtype=np.float32)
    for position, best in enumerate([3, 1, 2, 5]):
        logits[position, best] = 5.0
    rows = _rows(SamplingParams(temperature=0.0), 3)
    assert verify(logits, rows, Drafts([3, 1, 4]), np.zeros(3), np.zeros(4)) == [3, 1, 2]
    assert verify(logits, rows, Drafts([3, 1, 2]), np.zeros(3), np.zeros(4)) == [3, 1, 2, 5]
    assert verify(logits, rows, Drafts([0, 1, 2]), np.zeros(3), np.zeros(4)) == [3]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.9, min_p=0.2),
        SamplingParams(temperature=1.0, top_k=8, top_p=0.8, min_p=0.05),
    ],
    ids=["top_k", "top_p", "min_p", "all"],
)
def test_probabilities_are_what_the_sampler_draws_from(params):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(1, 40)).astype(np.float32) * 2
    p = probabilities(logits, [SamplingRow(params, [1], [])])[0]
    rows = [SamplingRow(params, [1], [])] * TRIALS
    drawn = Sampler(seed=3).sample(mx.array(np.repeat(logits, TRIALS, axis=0)), rows).token_ids
    counts = np.bincount(drawn, minlength=40).astype(float)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(p))  # nothing the filters drop is drawn
    assert _tv(counts, p) < 0.02


def test_ngram_continues_the_latest_match_of_the_longest_suffix():
    tokens = [1, 2, 3, 4, 9, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    # "1 2 3" (n=3) last occurred at 0, followed by 4 9 9; "2 3" alone would pick 5 6 (its latest match).
    assert propose_ngram(tokens, 3, 2, 3) == [4, 9, 9]
    assert propose_ngram(tokens, 2, 2, 2) == [5, 6]
    assert propose_ngram([1, 2, 3, 4], 3, 1, 3) == []  # no earlier occurrence of any suffix
    assert propose_ngram([5, 5], 3, 1, 2) == [5]  # only what follows the match exists
