"""Sampler: greedy, filters, penalties, seeds, logprobs and parameter validation, on synthetic logits."""

from __future__ import annotations

import engine  # noqa: F401  (loads OpenBLAS; must run before anything imports mlx)

# isort: split
from engine.errors import InvalidRequestError
from engine.messages import SamplingParams
from engine.output.sampler import Sampler, SamplingRow, validate_params

import mlx.core as mx
import numpy as np
import pytest

VOCAB = 49152
EOS = 2


def _row(
    params: SamplingParams, output: list[int] | None = None, prompt: list[int] | None = None
) -> SamplingRow:
    return SamplingRow(params, prompt or [5, 6, 7], output or [], {EOS})


def _logits(num_rows: int, vocab: int = VOCAB, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((num_rows, vocab)) * scale).astype(np.float32)


def _frequencies(params: SamplingParams, logits_row: np.ndarray, draws: int = 4000) -> np.ndarray:
    sampler = Sampler(seed=1)
    batch_size = max(1, min(draws, 2_000_000 // len(logits_row)))  # keeps each batch under 8 MB
    batch = mx.array(np.tile(logits_row, (batch_size, 1)))
    tokens: list[int] = []
    while len(tokens) < draws:
        tokens += sampler.sample(batch, [_row(params) for _ in range(batch_size)]).token_ids
    return np.bincount(tokens, minlength=len(logits_row)) / len(tokens)


def test_greedy_is_argmax_on_fast_and_general_paths():
    logits = _logits(16)
    fast = Sampler().sample(mx.array(logits), [_row(SamplingParams(temperature=0)) for _ in range(16)])
    assert fast.token_ids == logits.argmax(-1).tolist()
    assert fast.logprobs == [None] * 16
    # logprobs on one row forces the general path for the whole batch
    rows = [_row(SamplingParams(temperature=0, logprobs=1 if i == 3 else None)) for i in range(16)]
    assert Sampler().sample(mx.array(logits), rows).token_ids == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=1.5, top_p=1e-6, top_k=50),
        SamplingParams(temperature=1e-6),
        SamplingParams(temperature=1.0, min_p=1.0),
    ],
)
def test_degenerate_random_sampling_equals_greedy(params):
    logits = _logits(8, seed=3)
    result = Sampler(seed=0).sample(mx.array(logits), [_row(params) for _ in range(8)])
    assert result.token_ids == logits.argmax(-1).tolist()


def test_logit_bias_forces_a_token_greedy_and_sampled():
    logits = _logits(4, seed=4)
    forced = int(logits[0].argmin())
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, logit_bias={forced: 100.0})
        assert Sampler().sample(mx.array(logits), [_row(params)] * 4).token_ids[0] == forced


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached():
    logits = np.zeros((1, 100), dtype=np.float32)
    logits[0, EOS], logits[0, 9], logits[0, 40] = 10.0, 9.0, 8.0
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9])
    sampler = Sampler()
    assert sampler.sample(mx.array(logits), [_row(params, output=[1, 1])]).token_ids == [40]
    assert sampler.sample(mx.array(logits), [_row(params, output=[1, 1, 1])]).token_ids == [EOS]


def test_repetition_penalty_lowers_seen_tokens_positive_and_negative():
    logits = np.full((2, 50), -20.0, dtype=np.float32)
    logits[0, 10], logits[0, 11] = 2.0, 1.5  # seen 10 falls to 1.0 under penalty 2
    logits[1, 20], logits[1, 21] = -1.0, -1.5  # seen 20 falls to -2.0 under penalty 2
    plain = SamplingParams(temperature=0)
    penalized = SamplingParams(temperature=0, repetition_penalty=2.0)
    rows_plain = [_row(plain, output=[10]), _row(plain, prompt=[20])]
    assert Sampler().sample(mx.array(logits), rows_plain).token_ids == [10, 20]
    rows = [_row(penalized, output=[10]), _row(penalized, prompt=[20])]
    assert Sampler().sample(mx.array(logits), rows).token_ids == [11, 21]


@pytest.mark.parametrize("penalty", [5e-324, 1e-40, 1e30, 1e300])
def test_an_extreme_repetition_penalty_keeps_masked_tokens_masked_and_logits_finite(penalty):
    # 5e-324 is 0 in float32: -inf * 0 was nan, and a grammar-masked seen token won the argmax.
    logits = np.zeros((2, 64), dtype=np.float32)
    logits[:, 5], logits[:, 9], logits[:, 3] = 4.0, -1.0, 0.0
    mask = np.packbits(np.isin(np.arange(64), [5, 9]).astype(np.uint8), bitorder="little").view(np.int32)
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=penalty, logprobs=2),
        SamplingParams(temperature=1.0, repetition_penalty=penalty, logprobs=2, top_p=0.5),
    ]
    rows = [SamplingRow(p, [3, 5, 9, 1], [], {EOS}, allowed_token_mask=mask) for p in params]
    result = Sampler(0).sample(mx.array(logits), rows)
    assert all(token in (5, 9) for token in result.token_ids)
    assert all(np.isfinite(lp.logprob) for lp in result.logprobs if lp is not None)


def test_frequency_and_presence_penalties_count_output_tokens_only():
    logits = np.zeros((3, 50), dtype=np.float32)
    logits[:, 7], logits[:, 8] = 3.0, 2.0
    freq = SamplingParams(temperature=0, frequency_penalty=0.6)
    presence = SamplingParams(temperature=0, presence_penalty=1.5)
    rows = [_row(freq, output=[7, 7]), _row(freq, output=[7], prompt=[7, 7, 7]), _row(presence, output=[7])]
    # 3 - 2 * 0.6 = 1.8 < 2; 3 - 0.6 = 2.4 > 2 (prompt occurrences do not count); 3 - 1.5 < 2
    assert Sampler().sample(mx.array(logits), rows).token_ids == [8, 7, 8]


def test_sampling_does_not_write_into_the_callers_logits():
    logits = mx.array(_logits(2, seed=5))
    before = np.array(logits)
    params = SamplingParams(
        temperature=0.9, logit_bias={1: 50.0}, repetition_penalty=1.3, presence_penalty=1.0
    )
    Sampler().sample(logits, [_row(params, output=[3, 4]), _row(params, prompt=[1, 2])])
    np.testing.assert_array_equal(np.array(logits), before)


def test_sampled_frequencies_follow_the_softmax():
    logits_row = np.log(np.array([0.5, 0.25, 0.15, 0.1], dtype=np.float32))
    freqs = _frequencies(SamplingParams(temperature=1.0), logits_row)
    np.testing.assert_allclose(freqs, [0.5, 0.25, 0.15, 0.1], atol=0.03)
    # temperature 0.5 squares the probabilities before renormalizing
    squared = np.array([0.25, 0.0625, 0.0225, 0.01]) / 0.345
    np.testing.assert_allclose(_frequencies(SamplingParams(temperature=0.5), logits_row), squared, atol=0.03)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(top_p=0.75), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(top_k=3), [0.5, 0.3, 0.15, 0.0]),
        (SamplingParams(min_p=0.2), [0.5, 0.3, 0.15, 0.0]),
        (SamplingParams(top_k=3, top_p=0.85), [0.5, 0.3, 0.15, 0.0]),
        (SamplingParams(top_k=3, top_p=0.75), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(top_k=20000, top_p=0.75), [0.625, 0.375, 0.0, 0.0]),
    ],
)
def test_filters_keep_the_right_tokens_and_renormalize(params, expected):
    # Padded to a real vocabulary so the two-stage top-k and the nucleus search run; the padding is
    # impossible (-inf) so the expected distribution is exact.
    logits_row = np.full(VOCAB, -np.inf, dtype=np.float32)
    logits_row[[100, 9000, 20000, 49151]] = np.log([0.5, 0.3, 0.15, 0.05])
    freqs = _frequencies(params, logits_row, draws=2000)[[100, 9000, 20000, 49151]]
    expected = np.array(expected) / sum(expected)
    np.testing.assert_allclose(freqs, expected, atol=0.04)
    assert (freqs[expected == 0] == 0).all()


@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_top_p_over_a_wide_distribution_keeps_exactly_the_nucleus(top_p):
    # 3000 nearly equal tokens: the nucleus (about 1500 or 2700 of them) lies beyond the 64-token
    # candidates, and for 0.9 beyond the 2048-token ones, so every fallback of the search runs.
    logits_row = np.full(VOCAB, -np.inf, dtype=np.float32)
    logits_row[:3000] = -np.arange(3000, dtype=np.float32) * 1e-4
    probs = np.exp(logits_row[:3000].astype(np.float64))
    probs /= probs.sum()
    nucleus = int(((np.cumsum(probs) - probs) < top_p).sum())
    freqs = _frequencies(SamplingParams(top_p=top_p), logits_row, draws=1000)
    assert freqs[nucleus:].sum() == 0
    assert freqs[int(0.9 * nucleus) : nucleus].sum() > 0


def _seeded_tokens(batch_rows: list[SamplingParams], index: int, steps: int = 20) -> list[int]:
    """Tokens of row `index` over `steps` steps; every row sees fresh logits each step."""
    sampler = Sampler()
    outputs: list[list[int]] = [[] for _ in batch_rows]
    target_logits = _logits(steps, seed=11, scale=1.0)  # the seeded row's logits do not depend on the batch
    for step in range(steps):
        logits = _logits(len(batch_rows), seed=100 + step, scale=1.0)
        logits[index] = target_logits[step]
        rows = [_row(p, output=list(outputs[i])) for i, p in enumerate(batch_rows)]
        for i, token in enumerate(sampler.sample(mx.array(logits), rows).token_ids):
            outputs[i].append(token)
    return outputs[index]


@pytest.mark.parametrize(
    "seeded",
    [
        SamplingParams(temperature=1.0, seed=1234),
        SamplingParams(temperature=0.8, top_p=0.9, seed=-7),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=2**40),
    ],
)
def test_seeded_row_is_independent_of_batch_composition(seeded):
    others = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=50),
        SamplingParams(temperature=1.2, top_p=0.5, seed=99),
        SamplingParams(temperature=0.9, top_k=seeded.top_k, logprobs=3),
        SamplingParams(temperature=1.0, min_p=0.1, presence_penalty=0.5),
        SamplingParams(temperature=0.6, top_p=seeded.top_p),
    ]
    alone = _seeded_tokens([seeded], 0)
    assert len(set(alone)) > 5  # really random, so agreement below is not luck
    assert _seeded_tokens([*others[:3], seeded, *others[3:]], 3) == alone
    other_seed = SamplingParams(**{**seeded.__dict__, "seed": 5})
    assert _seeded_tokens([other_seed], 0) != alone


def test_seeded_row_draws_afresh_at_each_position_and_replays_exactly():
    logits = mx.array(np.zeros((1, 1000), dtype=np.float32))  # uniform: every draw is pure RNG
    params = SamplingParams(temperature=1.0, seed=7)

    def run() -> list[int]:
        output: list[int] = []
        for _ in range(20):
            output += Sampler().sample(logits, [_row(params, output=list(output))]).token_ids
        return output

    tokens = run()
    assert len(set(tokens)) > 15 and run() == tokens  # a recompute after preemption replays them


def test_logprobs_are_the_raw_log_softmax_with_sorted_top_k():
    logits = _logits(3, seed=8)
    params = [SamplingParams(temperature=0, logprobs=5), SamplingParams(temperature=1.0, logprobs=0)]
    biased = SamplingParams(temperature=0, logprobs=2, logit_bias={0: 100.0})
    result = Sampler().sample(mx.array(logits), [_row(params[0]), _row(params[1]), _row(biased)])
    as64 = logits.astype(np.float64)
    peak = as64.max(-1, keepdims=True)
    expected = as64 - peak - np.log(np.exp(as64 - peak).sum(-1, keepdims=True))
    for i, entry in enumerate(result.logprobs):
        assert entry is not None and entry.token_id == result.token_ids[i]
        assert entry.logprob <= 0 and entry.logprob == pytest.approx(expected[i, entry.token_id], abs=1e-4)
    greedy = result.logprobs[0]
    assert [t for t, _ in greedy.top] == np.argsort(-logits[0])[:5].tolist()
    assert [lp for _, lp in greedy.top] == pytest.approx(np.sort(expected[0])[::-1][:5].tolist(), abs=1e-4)
    assert greedy.top[0] == (greedy.token_id, pytest.approx(greedy.logprob))
    assert result.logprobs[1].top == []
    # the bias decides the token but logprobs stay those of the raw model logits
    assert result.token_ids[2] == 0 and len(result.logprobs[2].top) == 2
    assert result.logprobs[2].logprob == pytest.approx(expected[2, 0], abs=1e-4)


def test_top_logprobs_with_tied_logits_are_ordered_by_value_then_id():
    # bf16 models produce many exactly tied logits; the order must not depend on the batch.
    logits = np.random.default_rng(12).integers(0, 3000, (4, VOCAB)).astype(np.float32)
    rows = [_row(SamplingParams(temperature=0, logprobs=20)) for _ in range(4)]
    for i, entry in enumerate(Sampler().sample(mx.array(logits), rows).logprobs):
        assert [t for t, _ in entry.top] == np.argsort(-logits[i], kind="stable")[:20].tolist()


def test_non_contiguous_and_bfloat16_logits():
    full = mx.array(_logits(4 * 3, seed=9).reshape(4, 3, VOCAB))
    last = full[:, -1, :]
    expected = np.array(last).argmax(-1).tolist()
    params = SamplingParams(temperature=0, logprobs=1)
    assert Sampler().sample(last, [_row(params)] * 4).token_ids == expected
    as_bf16 = mx.array(np.log(np.array([[0.1, 0.7, 0.2]], dtype=np.float32))).astype(mx.bfloat16)
    assert Sampler().sample(as_bf16, [_row(SamplingParams(temperature=0, logprobs=1))]).token_ids == [1]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 1.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 11, "max_tokens": 10}, "min_tokens"),
        ({"stop_token_ids": [VOCAB + 3]}, "stop_token_ids"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
    ],
)
def test_invalid_params_raise_with_the_param_named(change, param):
    with pytest.raises(InvalidRequestError) as info:
        validate_params(SamplingParams(**change), VOCAB)
    assert info.value.param == param
    assert param in info.value.message


def test_valid_params_pass_validation():
    validate_params(SamplingParams(), VOCAB)
    full = SamplingParams(
        max_tokens=10,
        min_tokens=10,
        temperature=0,
        top_p=1.0,
        top_k=1,
        min_p=1.0,
        logit_bias={0: -100.0, VOCAB - 1: 100.0},
        logprobs=20,
        stop=["x"] * 16,
        stop_token_ids=[VOCAB - 1],
    )
    validate_params(full, VOCAB)
