"""Which products a CUDA decode path gives to the few-row kernels (engine/runner/cuda/rows_use.py): the
settings, the load-time checks' verdicts, and the count `/v1/status` shows. Without MLX's CUDA backend
every check refuses and every layer stays as it was."""

import logging

import engine  # noqa: F401  # isort: split
from engine.config import EngineConfig
from engine.runner.cuda import bf16_rows, quantized_rows, rows_use
from engine.runner.cuda.fused_projections import fuse
from engine.runner.cuda.small_matmul import SmallRowsLinear

import mlx.core as mx
import pytest
from mlx import nn

from tests.engine.runner.cuda.test_quantized_rows import quantized

requires_cpu_backend = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the CPU-only fallback")


def _dense(n: int, k: int) -> nn.Linear:
    linear = nn.Linear(k, n, bias=False)
    linear.weight = linear.weight.astype(mx.bfloat16)
    return linear


@requires_cpu_backend
def test_without_the_cuda_backend_the_checks_refuse_and_no_layer_is_rewritten(caplog):
    assert "the kernel failed" in (quantized_rows.check(quantized(32, 256)) or "")
    assert "the kernel failed" in (bf16_rows.check(SmallRowsLinear(_dense(32, 256).weight)) or "")
    model = nn.Sequential(quantized(32, 256), nn.ReLU(), quantized(256, 32 * 4), quantized(24, 256))
    before = [type(m) for m in model.layers]
    rows = rows_use.RowsKernels(quantized=True, bf16=False)
    with caplog.at_level(logging.WARNING, logger=rows_use.__name__):
        rows.rewrite(model)
    assert [type(m) for m in model.layers] == before
    assert "not used" in caplog.text
    assert rows.summary.startswith("0 of 3 4-bit products; 2 keep MLX's: the kernel failed")
    assert "1 keep MLX's: groups of 32, 64 or 128" in rows.summary
    assert rows.summary.endswith("; bf16 off (engine.cuda_bf16_rows is false)")


@requires_cpu_backend
def test_a_bf16_projection_the_check_refuses_keeps_the_small_rows_kernel():
    rows = rows_use.RowsKernels(quantized=True, bf16=True)
    model = nn.Sequential(_dense(32, 256), _dense(32, 256), _dense(24, 256))
    rows.rewrite(model)
    assert [type(m) for m in model.layers] == [SmallRowsLinear] * 3
    assert rows.num_taken == 0
    assert rows.summary.startswith("0 of 3 bf16 products; 2 keep MLX's: the kernel failed")
    assert "1 keep MLX's: K a multiple of 64 and N of 16 are needed" in rows.summary


def test_with_the_bf16_kernel_off_the_wrap_still_gives_few_rows_the_small_kernel():
    rows = rows_use.RowsKernels(quantized=True, bf16=False)
    assert type(rows(_dense(32, 256))) is SmallRowsLinear
    dense = _dense(32, 256)
    rows.rewrite(model := nn.Sequential(dense))
    assert model.layers[0] is dense and rows.num_taken == 0
    assert rows_use.RowsKernels(quantized=True, bf16=True).summary == "no few-row products"
    off = rows_use.RowsKernels(quantized=False, bf16=False)
    layer = quantized(32, 256)
    assert off(layer) is layer
    off.rewrite(model := nn.Sequential(layer))
    assert model.layers[0] is layer
    assert off.summary == (
        "4-bit off (engine.cuda_quantized_rows is false); bf16 off (engine.cuda_bf16_rows is false)"
    )


def test_the_engine_settings_are_on_unless_false():
    assert EngineConfig(model="m").cuda_quantized_rows is None
    assert EngineConfig(model="m").cuda_bf16_rows is None
    assert EngineConfig(model="m", cuda_quantized_rows=False).cuda_quantized_rows is False
    assert EngineConfig(model="m", cuda_bf16_rows=False).cuda_bf16_rows is False


def test_a_later_build_counts_the_kernels_an_earlier_one_left_in_the_model():
    attn = nn.Module()
    attn.q_proj, attn.k_proj = quantized(32, 256), quantized(32, 256)
    attn.o_proj = quantized_rows.QuantizedRowsLinear(quantized(256, 64))
    attn.down = bf16_rows.Bf16RowsLinear(SmallRowsLinear(_dense(32, 256).weight))
    assert (
        fuse(attn, ("q_proj", "k_proj"), quantized_rows.QuantizedRowsLinear) is not None
    )  # a first path's wrap
    model = nn.Module()
    model.attn = attn
    rows = rows_use.RowsKernels(quantized=True, bf16=True)
    rows.rewrite(model)
    rows.rewrite(model)  # each wrapper counts once
    assert rows.summary == "2 of 2 4-bit products; 1 of 1 bf16 products"
