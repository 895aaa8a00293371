"""The bf16 rows kernel's gate (engine/runner/cuda/bf16_rows.py): which projections it takes, and which
rows it leaves to small_matmul.py and MLX. The kernel runs on a GPU only: its load-time check there
compares it with MLX's product (tests/engine/runner/cuda/test_rows_use.py: what happens without one)."""

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import bf16_rows
from engine.runner.cuda.small_matmul import SmallRowsLinear

import mlx.core as mx
from mlx import nn


def small(n: int, k: int) -> SmallRowsLinear:
    return SmallRowsLinear((mx.random.normal((n, k), key=mx.random.key(n + k)) * 0.02).astype(mx.bfloat16))


def test_it_takes_plain_bf16_projections_whose_shapes_fill_its_chunks_and_tiles():
    assert bf16_rows.refusal(small(32, 256)) is None
    assert bf16_rows.refusal(nn.Linear(256, 32)) == "not a plain bf16 projection"
    for layer in (small(24, 256), small(32, 96)):
        assert "are needed" in (bf16_rows.refusal(layer) or "")


def test_five_to_128_bf16_rows_are_the_kernels_and_the_rest_mlx_own():
    assert bf16_rows.MIN_ROWS == 5
    layer = small(32, 256)
    fast = bf16_rows.Bf16RowsLinear(layer)
    for x in (
        mx.random.normal((1, 256)).astype(mx.bfloat16),
        mx.random.normal((129, 256)).astype(mx.bfloat16),
        mx.random.normal((6, 256)),
    ):
        assert mx.array_equal(fast(x), x @ layer.weight.T).item()
