"""The few-row kernel's skeleton (engine/runner/cuda/rows_mma.py): how a product is tiled and split over K,
where the slices are added, and that a layer's arrival counters are not among its parameters."""

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import quantized_rows, rows_mma

import mlx.core as mx
import pytest
from mlx import nn


@pytest.mark.parametrize(
    ("rows", "tiles"), [(2, (1, 2)), (8, (1, 2)), (9, (2, 2)), (64, (8, 2)), (65, (9, 1)), (128, (16, 1))]
)
def test_a_warp_takes_two_column_tiles_until_the_row_tiles_fill_its_registers(rows, tiles):
    assert rows_mma.tiles(rows) == tiles


@pytest.mark.parametrize(("chunk", "weight_bytes"), [(quantized_rows.CHUNK, quantized_rows.BITS / 8)])
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
    linear = nn.Linear(256, 48, bias=False)
    layer = nn.QuantizedLinear.from_linear(linear, group_size=64, bits=4)
    fast = quantized_rows.QuantizedRowsLinear(layer)
    assert fast.arrivals.counts.shape == (3,) and fast.arrivals.counts.dtype == mx.uint32
    assert not mx.any(fast.arrivals.counts).item()
    assert "arrivals" not in fast.parameters()


def _launched(rows: int, slices: int) -> tuple[dict, mx.array]:
    seen: dict = {}

    def kernel(**kwargs):
        seen.update(kwargs)
        return [
            mx.ones(s, dtype=d) for s, d in zip(kwargs["output_shapes"], kwargs["output_dtypes"], strict=True)
        ]

    x = mx.zeros((rows, 256), dtype=mx.bfloat16)
    out = rows_mma.launch(kernel, x, [], rows_mma.Arrivals(48), 48, [], slices)
    return seen, out


@pytest.mark.parametrize(
    ("rows", "slices", "inside"), [(8, 4, 1), (32, 4, 1), (33, 4, 0), (64, 1, 1), (128, 2, 0)]
)
def test_up_to_32_rows_the_kernel_adds_its_slices_past_them_mlx_does(rows, slices, inside):
    seen, out = _launched(rows, slices)
    assert ("REDUCE", inside) in seen["template"]
    assert seen["grid"][1] == slices and out.shape == (rows, 48) and out.dtype == mx.bfloat16
    want = 1 if inside else slices  # MLX's sum over the partial slices of ones
    assert mx.all(out == want).item()
