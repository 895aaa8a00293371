"""The CUDA draw kernel's arithmetic (engine/output/draw_kernel.py), through its NumPy mirror: it chooses
what the device sampler's MLX operations choose, its load check catches a kernel that does not, and it
serves only batches it can. The kernel itself runs on a GPU only (bench/gpu.py --check runs its check)."""

from __future__ import annotations

import engine  # noqa: F401  (loads OpenBLAS; must run before anything imports mlx)

# isort: split
from engine.messages import SamplingParams
from engine.output.device_filters import draw_random
from engine.output.draw_kernel import applies, check, for_device, mirror, row_params
from engine.output.sampler import SamplingRow

import mlx.core as mx
import numpy as np


def _mirror(logits: mx.array, params: np.ndarray) -> mx.array:
    return mx.array(mirror(np.asarray(logits), params))


def _row(params: SamplingParams) -> SamplingRow:
    return SamplingRow(params, [1], [])


def test_the_mirror_passes_the_load_check():
    assert check(_mirror) is None


def test_the_load_check_refuses_a_kernel_that_chooses_otherwise():
    def no_top_p(logits, params):
        return _mirror(logits, np.column_stack([params[:, 0], np.ones(len(params)), params[:, 2:]]))

    def last_of_ties(logits, params):
        out = np.asarray(_mirror(logits, params)).copy()
        x = np.asarray(logits)
        greedy = params[:, 0] == 0
        out[greedy] = x.shape[1] - 1 - np.argmax(x[greedy][:, ::-1], axis=-1)
        return mx.array(out)

    assert check(no_top_p) == "rows [2, 5, 9, 16, 17, 24, 26] of probe 0 chose other tokens than the MLX operations"  # fmt: skip
    assert check(last_of_ties) == "rows [0] of probe 0 chose other tokens than the MLX operations"


def test_the_mirror_agrees_with_the_mlx_operations_on_random_batches():
    """Exact masses against float32 prefix sums: they may part where rounding moves a cut-off or the
    draw's target across a token (measured: 1 row in 480 here, a flat distribution of 2,141 kept tokens),
    allowed below once in 100."""
    rng = np.random.default_rng(1)
    parted = total = 0
    for _ in range(30):
        vocab = int(rng.integers(50, 3000))
        rows = [
            _row(SamplingParams(
                temperature=float(rng.choice([0.1, 0.7, 1.0, 2.0])),
                top_p=float(rng.choice([1.0, 0.9, 0.5, 0.99])),
                min_p=float(rng.choice([0.0, 0.05])),
            ))
            for _ in range(16)
        ]  # fmt: skip
        logits = (rng.standard_normal((16, vocab)) * rng.choice([0.5, 3.0, 10.0], (16, 1))).astype(np.float32)
        uniforms = rng.random(16).astype(np.float32)
        mine = mirror(logits, row_params(rows, uniforms))
        theirs = np.asarray(draw_random(mx.array(logits), rows, uniforms))
        parted += int((mine != theirs).sum())
        total += len(rows)
    assert parted <= total / 100, f"{parted} of {total}"


def test_it_serves_batches_without_top_k_and_only_on_cuda():
    assert applies(
        [_row(SamplingParams(temperature=0.8, top_p=0.9)), _row(SamplingParams(temperature=0.0, top_k=5))],
        100,
    )
    assert not applies([_row(SamplingParams(temperature=0.8, top_k=5))], 100)
    assert applies([_row(SamplingParams(temperature=0.8, top_k=100))], 100)  # top_k of the whole vocabulary
    assert for_device() is None  # the CPU backend: the MLX operations choose


def test_row_params_mark_greedy_rows_with_a_zero_inverse_temperature():
    rows = [
        _row(SamplingParams(temperature=0.0)),
        _row(SamplingParams(temperature=0.5, top_p=0.9, min_p=0.1)),
    ]
    params = row_params(rows, np.array([0.25, 0.75], dtype=np.float32))
    assert params.tolist() == [[0.0, 0.0, 0.0, 0.0], [2.0, np.float32(0.9), np.float32(0.1), 0.75]]
