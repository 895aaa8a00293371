"""The 4-bit rows kernel's gate (engine/runner/cuda/quantized_rows.py): which layers it takes and what it
leaves to MLX. The kernel itself runs on a GPU only: its load-time check there compares it with
mx.quantized_matmul (tests/engine/runner/cuda/test_rows_use.py: what happens without one)."""

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import quantized_rows as qr

import mlx.core as mx
from mlx import nn


def quantized(n: int, k: int, bits: int = 4, group_size: int = 64, dtype=mx.bfloat16) -> nn.QuantizedLinear:
    linear = nn.Linear(k, n, bias=False)
    linear.weight = (mx.random.normal((n, k), key=mx.random.key(n + k)) * 0.02).astype(dtype)
    return nn.QuantizedLinear.from_linear(linear, group_size=group_size, bits=bits)


def test_it_takes_4_bit_affine_layers_of_bf16_with_the_shapes_its_tiles_need():
    assert qr.refusal(quantized(32, 256)) is None
    assert qr.refusal(quantized(32, 256, group_size=32)) is None
    assert qr.refusal(quantized(32, 256, group_size=128)) is None
    assert qr.refusal(nn.Linear(256, 32)) == "not an nn.QuantizedLinear"
    assert qr.refusal(quantized(32, 256, bits=8)) == "not 4-bit affine"
    for layer in (quantized(24, 256), quantized(32, 192), quantized(32, 256, dtype=mx.float32)):
        assert "are needed" in (qr.refusal(layer) or "")


def test_one_row_more_than_128_rows_and_float32_rows_go_to_mlx_own_product():
    layer = quantized(32, 256)
    fast = qr.QuantizedRowsLinear(layer)
    for x in (
        mx.random.normal((1, 256)).astype(mx.bfloat16),
        mx.random.normal((129, 256)).astype(mx.bfloat16),
        mx.random.normal((4, 256)),
    ):
        assert mx.array_equal(fast(x), layer(x)).item()
