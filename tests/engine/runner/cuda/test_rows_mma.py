"""The few-row kernels' shared skeleton (engine/runner/cuda/rows_mma.py): how a product is tiled and split
over K for 4-bit and bf16 weights, and that a layer's arrival counters are not among its parameters."""

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import bf16_rows, quantized_rows, rows_mma

import mlx.core as mx
import pytest
from mlx import nn


@pytest.mark.parametrize(
    ("rows", "tiles"), [(2, (1, 2)), (8, (1, 2)), (9, (2, 2)), (64, (8, 2)), (65, (9, 1)), (128, (16, 1))]
)
def test_a_warp_takes_two_column_tiles_until_the_row_tiles_fill_its_registers(rows, tiles):
    assert rows_mma.tiles(rows) == tiles


@pytest.mark.parametrize(
    ("chunk", "weight_bytes"), [(quantized_rows.CHUNK, quantized_rows.BITS / 8), (bf16_rows.CHUNK, 2)]
)
@pytest.mark.parametrize("n", [512, 2048, 3072, 4096, 28672, 128256])
@pytest.mark.parametrize("k", [2048, 4096, 8192, 14336])
@pytest.mark.parametrize("rows", [2, 8, 64, 128])
def test_k_slices_are_whole_chunks_and_their_partial_sums_stay_under_the_weight_bytes(
    chunk, weight_bytes, n, k, rows
):
    slices = rows_mma.num_slices(n, k, rows, chunk, weight_bytes)
    assert 1 <= slices <= k // chunk
    if slices > 1:
        partial_bytes = 2 * slices * rows * n * 4  # written, then read back by the last warp of a tile
        assert partial_bytes <= n * k * weight_bytes
        blocks = -(-n // (64 * rows_mma.tiles(rows)[1]))
        assert blocks * (slices - 1) < rows_mma.TARGET_BLOCKS  # one slice fewer would not reach the target


def test_a_layer_holds_one_counter_per_finest_column_tile_outside_its_parameters():
    layer = nn.Linear(256, 48, bias=False)
    layer.weight = layer.weight.astype(mx.bfloat16)
    fast = bf16_rows.Bf16RowsLinear(bf16_rows.small_matmul.SmallRowsLinear(layer.weight))
    assert fast.arrivals.counts.shape == (3,) and fast.arrivals.counts.dtype == mx.uint32
    assert not mx.any(fast.arrivals.counts).item()
    assert set(fast.parameters()) == {"weight"}
