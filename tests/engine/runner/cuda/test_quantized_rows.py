"""The 4-bit rows kernel's gate (engine/runner/cuda/quantized_rows.py): which layers it takes (its tiling
and k-split: test_rows_mma.py), and that without MLX's CUDA backend it steps aside and leaves every layer as it was.
The kernel itself runs on a GPU only: its load-time check there compares it with mx.quantized_matmul."""

import logging

import engine  # noqa: F401  # isort: split
from engine.config import EngineConfig
from engine.runner.cuda import quantized_rows as qr
from engine.runner.cuda.fused_projections import fuse

import mlx.core as mx
import pytest
from mlx import nn

requires_cpu_backend = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the CPU-only fallback")


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


@requires_cpu_backend
def test_without_the_cuda_backend_the_check_refuses_and_no_layer_is_rewritten(caplog):
    assert "the kernel failed" in (qr.check(quantized(32, 256)) or "")
    model = nn.Sequential(quantized(32, 256), nn.ReLU(), quantized(256, 32 * 4), quantized(24, 256))
    before = [type(m) for m in model.layers]
    rows = qr.QuantizedRowsUse(on=True)
    with caplog.at_level(logging.WARNING, logger=qr.__name__):
        rows.rewrite(model)
    assert [type(m) for m in model.layers] == before
    assert "not used" in caplog.text
    assert rows.summary.startswith("0 of 3 quantized products; 2 keep MLX's: the kernel failed")
    assert "1 keep MLX's: groups of 32, 64 or 128" in rows.summary


def test_the_wrap_gives_bf16_products_the_small_rows_kernel_and_counts_only_quantized_ones():
    dense = nn.Linear(256, 32, bias=False)
    dense.weight = dense.weight.astype(mx.bfloat16)
    for on in (True, False):
        rows = qr.QuantizedRowsUse(on)
        assert type(rows(dense)).__name__ == "SmallRowsLinear"
        assert rows.num_taken == 0 and not rows.kept
    assert qr.QuantizedRowsUse(on=True).summary == "no quantized products"
    off = qr.QuantizedRowsUse(on=False)
    layer = quantized(32, 256)
    assert off(layer) is layer
    off.rewrite(model := nn.Sequential(layer))
    assert model.layers[0] is layer and off.summary == "off (engine.cuda_quantized_rows is false)"


def test_the_engine_setting_is_on_unless_false():
    assert EngineConfig(model="m").cuda_quantized_rows is None
    assert EngineConfig(model="m", cuda_quantized_rows=False).cuda_quantized_rows is False


def test_a_later_build_counts_the_kernels_an_earlier_one_left_in_the_model():
    attn = nn.Module()
    attn.q_proj, attn.k_proj = quantized(32, 256), quantized(32, 256)
    attn.o_proj = qr.QuantizedRowsLinear(quantized(256, 64))
    assert fuse(attn, ("q_proj", "k_proj"), qr.QuantizedRowsLinear) is not None  # as a first path's wrap
    model = nn.Module()
    model.attn = attn
    rows = qr.QuantizedRowsUse(on=True)
    rows.rewrite(model)
    rows.rewrite(model)  # each wrapper counts once
    assert rows.summary == "2 of 2 quantized products"


def test_the_rewrite_reaches_layers_a_module_holds_in_a_list():
    layer = quantized(32, 256)
    rows = qr.QuantizedRowsUse(on=True)
    rows._checked[(*layer.weight.shape, layer.group_size)] = None  # as if the check had passed on a GPU
    model = nn.Sequential(layer, nn.ReLU())
    rows.rewrite(model)
    assert type(model.layers[0]) is qr.QuantizedRowsLinear and model.layers[0].inner is layer
    assert rows.summary == "1 of 1 quantized products"
