"""Device sampler: the filtered distribution, agreement with the host sampler, seeds, logprobs, masks."""

from __future__ import annotations

import engine  # noqa: F401  (loads OpenBLAS; must run before anything imports mlx)

# isort: split
from engine.messages import SamplingParams
from engine.output.device_sampler import sample_on_device
from engine.output.distribution import edited_logits, probabilities
from engine.output.draw_kernel import Draw, mirror
from engine.output.sampler import LOGPROB_FLOOR, Sampler, SamplingRow

import mlx.core as mx
import numpy as np
import pytest

from tests.engine.output.test_structured_output import packed

EOS = 2
VOCAB = 300  # over two draw blocks of 128, and not a multiple of one: the padded block is drawn from too
DRAWS = 8192


def _row(
    params: SamplingParams, output: list[int] | None = None, prompt: list[int] | None = None, **kwargs
) -> SamplingRow:
    return SamplingRow(params, prompt or [5, 6, 7, 11], output or [], {EOS}, **kwargs)


def _logits(num_rows: int, vocab: int = VOCAB, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((num_rows, vocab)) * scale).astype(np.float32)


# Every test runs twice: tokens chosen by MLX operations, and by the CUDA draw kernel's arithmetic (its
# NumPy mirror, engine/output/draw_kernel.py), which serves mixed batches without top_k on a GPU.
_DRAW: list[Draw | None] = [None]


def _mirror(logits: mx.array, params: np.ndarray) -> mx.array:
    return mx.array(mirror(np.asarray(logits), params))


@pytest.fixture(params=["mlx operations", "draw kernel mirror"], autouse=True)
def draw_path(request):
    _DRAW[0] = _mirror if request.param == "draw kernel mirror" else None
    yield
    _DRAW[0] = None


def _device(logits: np.ndarray, rows: list[SamplingRow], uniforms: np.ndarray | None = None):
    uniforms = Sampler(0).uniforms(rows) if uniforms is None else uniforms
    return sample_on_device(mx.array(logits), rows, uniforms, _DRAW[0]).read()


DISTRIBUTIONS = {
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(temperature=1.0, top_k=12),
    "top_p": SamplingParams(temperature=1.0, top_p=0.7),
    "min_p": SamplingParams(temperature=1.3, min_p=0.08),
    "all_three": SamplingParams(temperature=0.9, top_k=20, top_p=0.8, min_p=0.05),
    "logit_bias": SamplingParams(temperature=1.0, top_p=0.9, logit_bias={3: 4.0, 17: -50.0, 299: 6.0}),
    "penalties": SamplingParams(
        temperature=1.0, top_k=40, repetition_penalty=1.8, presence_penalty=1.5, frequency_penalty=0.7
    ),
}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_draws_follow_the_exact_filtered_distribution(name):
    """Stratified uniforms (i + 1/2) / DRAWS: an inverse-CDF draw in any fixed token order gives each token
    its probability times DRAWS, give or take one draw, so a correct sampler's total variation is below
    support / (2 * DRAWS); the bound allows twice that for float32 rounding at the boundaries. Keeping or
    dropping one token wrongly here costs more (checked against broken variants of each filter)."""
    logits = _logits(1, seed=21)
    best = np.argsort(-logits[0])[:4].tolist()  # penalties hit the likeliest tokens, where they matter
    row = _row(DISTRIBUTIONS[name], output=[best[0], best[0], best[1], 9], prompt=[best[2], 6])
    exact = probabilities(edited_logits(logits, [row]), [row])[0]
    uniforms = np.random.default_rng(1).permutation((np.arange(DRAWS) + 0.5) / DRAWS)
    tokens = _device(np.repeat(logits, DRAWS, axis=0), [row] * DRAWS, uniforms).token_ids
    empirical = np.bincount(tokens, minlength=VOCAB) / DRAWS
    support = int((exact > 0).sum())
    assert support > 5, "the test needs a real distribution to compare"
    assert (empirical[exact == 0] == 0).all(), "a filtered-out token was drawn"
    assert 0.5 * np.abs(empirical - exact).sum() < support / DRAWS


def test_the_same_uniforms_give_the_host_samplers_tokens():
    """Rows without top_k: the host draws in vocabulary order too, so a seeded row (whose uniform is a
    function of its seed) gets the same token on both paths. float32 against the host's float64 prefix
    sums may move a uniform lying within ~1e-7 of a boundary: rare, and allowed below once in 200."""
    params = [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=1.2, min_p=0.05, top_p=0.95, logit_bias={4: 3.0}),
        SamplingParams(temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.4, min_tokens=9),
    ]
    for vocab in (1000, 6000):  # the host draws flat below 4096 tokens, in blocks above
        rows = [_row(replace_seed(params[i % 4], i), output=[i % 7, 3]) for i in range(256)]
        logits = _logits(len(rows), vocab, seed=vocab)
        host = Sampler(0).sample(mx.array(logits), rows).token_ids
        device = _device(logits, rows).token_ids
        assert np.mean(np.array(host) != np.array(device)) <= 1 / 200, vocab
        assert len(set(device)) > 100


def replace_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "seed": seed})


@pytest.mark.parametrize(
    "seeded",
    [
        SamplingParams(temperature=1.0, seed=1234),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=2**40),
    ],
)
def test_a_seeded_row_replays_and_does_not_depend_on_its_batch(seeded):
    target = _logits(1, 4096, seed=3)
    others = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_k=5, logprobs=2),
        SamplingParams(temperature=1.1, top_p=0.5, presence_penalty=0.5),
    ]

    def tokens(batch: list[SamplingParams], index: int) -> list[int]:
        logits = _logits(len(batch), 4096, seed=9)
        logits[index] = target[0]
        rows = [_row(p) for p in batch]
        out = []
        for position in range(12):  # a pending output counts for the position like a read one
            rows[index].num_pending_outputs = position
            out.append(_device(logits, rows, Sampler(position).uniforms(rows)).token_ids[index])
        return out

    alone = tokens([seeded], 0)
    assert len(set(alone)) > 4  # really random, so agreement below is not luck
    assert tokens([*others[:2], seeded, others[2]], 2) == alone
    assert tokens([replace_seed(seeded, 5)], 0) != alone


def test_greedy_rows_are_the_argmax_beside_sampled_ones():
    logits = _logits(16, 5000, seed=4)
    rows = [_row(SamplingParams(temperature=0.0 if i % 3 else 1.0, top_p=0.9)) for i in range(16)]
    tokens = np.array(_device(logits, rows).token_ids)
    greedy = [i for i in range(16) if i % 3]
    assert (tokens[greedy] == logits[greedy].argmax(-1)).all()
    rows = [_row(SamplingParams(temperature=0.7, top_k=1)), _row(SamplingParams(temperature=1.0, min_p=1.0))]
    assert _device(logits[:2], rows).token_ids == logits[:2].argmax(-1).tolist()


def test_logprobs_equal_the_host_samplers():
    logits = _logits(5, 3000, seed=8)
    logits[3] = np.round(logits[3])  # many exact ties, as bfloat16 logits have: ordered by id
    mask = packed([5, 9, 700, 2999], 3000)  # fewer allowed tokens than top logprobs: -inf ties
    rows = [
        _row(SamplingParams(temperature=0, logprobs=5)),
        _row(SamplingParams(temperature=1.0, top_p=0.8, logprobs=0, seed=1)),
        _row(SamplingParams(temperature=0, logprobs=3, logit_bias={0: 100.0})),
        _row(SamplingParams(temperature=0.9, logprobs=20, seed=2)),
        _row(SamplingParams(temperature=0, logprobs=8), allowed_token_mask=mask),
    ]
    host = Sampler(0).sample(mx.array(logits), rows)
    device = _device(logits, rows)
    assert device.token_ids == host.token_ids
    for h, d in zip(host.logprobs, device.logprobs):
        assert d is not None and h is not None and d.token_id == h.token_id
        assert d.logprob == pytest.approx(h.logprob, abs=1e-4)
        assert [t for t, _ in d.top] == [t for t, _ in h.top]
        assert [v for _, v in d.top] == pytest.approx([v for _, v in h.top], abs=1e-4)
    assert device.logprobs[4].top[-1][1] == LOGPROB_FLOOR


def test_structured_masks_allow_only_their_tokens_and_nothing_past_the_mask():
    vocab = 600
    logits = np.zeros((4, vocab), dtype=np.float32)
    logits[:, 590] = 50.0  # past the 512-token mask: never allowed
    logits[:, 7] = 5.0
    mask = packed([3, 7, 40, 300], 512)
    rows = [
        _row(SamplingParams(temperature=0.0), allowed_token_mask=mask),
        _row(SamplingParams(temperature=5.0, seed=1), allowed_token_mask=mask),
        _row(SamplingParams(temperature=0.0)),
        _row(SamplingParams(temperature=5.0, top_k=3, seed=2), allowed_token_mask=mask),
    ]
    drawn = set()
    for position in range(40):
        rows[1].num_pending_outputs = rows[3].num_pending_outputs = position
        tokens = _device(logits, rows).token_ids
        assert tokens[0] == 7 and tokens[2] == 590
        drawn |= {tokens[1], tokens[3]}
    assert drawn == {3, 7, 40, 300}


def test_min_tokens_masks_eos_and_stop_ids_counting_pending_outputs():
    logits = np.zeros((1, 200), dtype=np.float32)
    logits[0, EOS], logits[0, 9], logits[0, 40] = 10.0, 9.0, 8.0
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9])
    assert _device(logits, [_row(params, output=[1, 1])]).token_ids == [40]
    assert _device(logits, [_row(params, output=[1], num_pending_outputs=2)]).token_ids == [EOS]
    # The grammar wins over min_tokens where it allows only EOS.
    only_eos = _row(params, allowed_token_mask=packed([EOS], 200))
    assert _device(logits, [only_eos]).token_ids == [EOS]


@pytest.mark.parametrize("penalty", [5e-324, 1e30])
def test_extreme_penalties_keep_masked_tokens_masked_and_edits_equal_the_hosts(penalty):
    logits = _logits(3, 256, seed=6)
    mask = packed([5, 9, 100], 256)
    params = SamplingParams(
        temperature=0.0, repetition_penalty=penalty, presence_penalty=-2.0, logit_bias={9: 1.5}
    )
    rows = [
        _row(params, output=[5, 9, 9], allowed_token_mask=mask),
        _row(SamplingParams(temperature=0.0, frequency_penalty=2.0), output=[int(logits[1].argmax())] * 2),
        _row(SamplingParams(temperature=0.0)),
    ]
    tokens = _device(logits, rows).token_ids
    assert tokens == Sampler(0).sample(mx.array(logits), rows).token_ids
    assert tokens[0] in (5, 9, 100) and tokens[1] != logits[1].argmax()


def test_a_token_id_outside_the_vocabulary_raises_instead_of_editing_the_next_row():
    row = _row(SamplingParams(temperature=0.0, logit_bias={VOCAB + 3: 5.0}))
    with pytest.raises(IndexError):
        _device(_logits(2), [_row(SamplingParams(temperature=0.0)), row])
