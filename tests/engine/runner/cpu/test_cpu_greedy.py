"""Greedy rows through the C forward's screened head (engine/runner/cpu/cpu_greedy.h): the full head's
tokens and logit bits, a tie the bfloat16 copy cannot see, the rows the screen leaves to the full head,
and the heads it does not screen."""

import platform

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import cpu_decode

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from tests.engine.runner.cpu.test_cpu_decode import make_cpu_decode, tiny_llama, tiny_storage

VOCAB = 300


def fresh_inputs(decode, storage, tokens: list[int], positions: list[int]):
    """The kernel's numpy inputs for rows at `positions`, each in blocks of its own, over new pools."""
    shape, block_size = storage.shapes[0], storage.block_size
    width = max(positions) // block_size + 1
    tables = np.arange(len(tokens) * width, dtype=np.int32).reshape(len(tokens), width)
    pools = [
        np.zeros((shape.num_kv_heads, tables.size, block_size, shape.k_head_dim), np.float32)
        for _ in range(2 * len(storage.shapes))
    ]
    return np.array(tokens, np.int32), np.array(positions, np.int32), tables, pools, tables.size


def test_greedy_tokens_and_their_logits_are_the_full_heads():
    model = tiny_llama(vocab_size=VOCAB)
    storage = tiny_storage(model)
    decode = make_cpu_decode(model, storage)
    assert decode is not None and decode.screen is not None
    rng = np.random.default_rng(0)
    for rows in (1, 2, cpu_decode.SCREEN_ROWS):
        for _ in range(4):
            inputs = fresh_inputs(decode, storage, rng.integers(0, VOCAB, rows).tolist(), [0] * rows)
            full = decode(*inputs)
            chosen, screened = decode.greedy(*inputs)
            assert chosen.tolist() == full.argmax(axis=1).tolist()
            picked = np.arange(rows), chosen
            assert screened[picked].tobytes() == full[picked].tobytes()


def normed_hidden(model, token: int) -> np.ndarray:
    """The final normed hidden state of `token` alone at position 0: what the head multiplies."""
    return np.array(model.model(mx.array([[token]]))[0, -1])


def with_head(model, head: np.ndarray) -> None:
    model.lm_head.weight = mx.array(head.astype(np.float32))
    mx.eval(model.parameters())


def spiked_head(model, token: int, scales: dict[int, float]) -> np.ndarray:
    """Small random rows, and rows `scales` names that read only the hidden state's largest component
    (with its sign), times 64 times their scale: those tokens' logits lead by far."""
    h = normed_hidden(model, token)
    k = int(np.abs(h).argmax())
    head = np.array(model.lm_head.weight) * 1e-3
    for row, scale in scales.items():
        head[row] = 0.0
        head[row, k] = np.sign(h[k]) * 64.0 * scale
    return head


def test_a_tie_in_bfloat16_goes_to_the_larger_float32_logit():
    # Rows 5 and 9 are the same in bfloat16 (64 and 64 * (1 + 2^-10) round alike), so the screen alone
    # would see a tie and take row 5, the first; in float32 row 9's logit is larger.
    model = tiny_llama(vocab_size=VOCAB)
    with_head(model, spiked_head(model, 7, {5: 1.0, 9: 1 + 2**-10}))
    storage = tiny_storage(model)
    decode = make_cpu_decode(model, storage)
    assert decode is not None and decode.screen is not None
    copy = decode.screen.weights
    assert copy[5].tobytes() == copy[9].tobytes()
    full = decode(*fresh_inputs(decode, storage, [7], [0]))
    assert int(full.argmax()) == 9
    assert decode.step_greedy(mx.array([7]), [0], [[0]], [0]) == [9]


def test_too_many_candidates_take_the_full_head():
    # Every row the same in bfloat16, eight float32 values among them: all 300 stay candidates, past
    # cpu_greedy.h's 64, so the row's full logits decide (the first of the largest: row 7). Not packed:
    # one weight per row, such a head is 8-bit codes exactly (exact_pack.py), which is not screened.
    scales = {row: 1 + (row % 8) * 2**-12 for row in range(VOCAB)}
    model = tiny_llama(vocab_size=VOCAB)
    with_head(model, spiked_head(model, 7, scales))
    storage = tiny_storage(model)
    decode = make_cpu_decode(model, storage, exact_packing=False)
    assert decode is not None and decode.screen is not None
    chosen, screened = decode.greedy(*fresh_inputs(decode, storage, [7], [0]))
    full = decode(*fresh_inputs(decode, storage, [7], [0]))
    assert chosen.tolist() == [7] == [int(full.argmax())]
    assert screened.tobytes() == full.tobytes()  # the whole row's logits, as the full head's


def test_quantized_heads_and_many_rows_are_not_screened():
    model = tiny_llama(vocab_size=VOCAB, hidden_size=128)
    nn.quantize(model, group_size=32, bits=4)
    quantized = make_cpu_decode(model, tiny_storage(model))
    assert quantized is not None and quantized.screen is None
    assert quantized.step_greedy(mx.array([3]), [0], [[0]], [0]) is None
    plain = make_cpu_decode(model := tiny_llama(vocab_size=VOCAB), tiny_storage(model))
    rows = cpu_decode.SCREEN_ROWS + 1
    tables = [[b] for b in range(rows)]
    assert plain.step_greedy(mx.array(list(range(rows))), [0] * rows, tables, list(range(rows))) is None


@pytest.mark.skipif(not {"avx2", "fma"} <= set(cpu_decode._cpu_id().split()), reason="needs AVX2 and FMA")
def test_the_avx2_screen_agrees_too(monkeypatch):
    # Built for Haswell (8-float vectors, no AVX-512), as an AVX2-only CPU gets it.
    monkeypatch.setenv("MLX_RAY_SERVE_KERNEL_MARCH", "haswell")
    test_greedy_tokens_and_their_logits_are_the_full_heads()
    test_a_tie_in_bfloat16_goes_to_the_larger_float32_logit()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 is the baseline -march named here")
def test_the_portable_build_reads_the_full_head(monkeypatch):
    # Its loops are vectorized by the compiler, which may sum a candidate's logit in another order than the
    # full head's: it does not screen, and its greedy tokens are the full head's argmax.
    monkeypatch.setenv("MLX_RAY_SERVE_KERNEL_MARCH", "x86-64")
    model = tiny_llama(vocab_size=VOCAB)
    storage = tiny_storage(model)
    decode = make_cpu_decode(model, storage)
    assert decode is not None and decode.screen is None
    assert decode.step_greedy(mx.array([3]), [0], [[0]], [0]) is None
