"""Products of 5 to 128 rows with bf16 weights as one tensor-core kernel of the project's own, for MLX's
CUDA backend.

Owns the kernel's weight format and its load-time check; never runs on other devices, never takes 1 to
4 rows (small_matmul.py's kernel and MLX's GEMV serve them) or more than 128 (a prefill: cuBLAS).
Why: at these rows MLX hands each product to cuBLASLt, whose launch costs the host about 21 us
(bench/gpu_launch_cost.py, H200), and the 1B-shaped decode at batch 64 is bound by that host time
(65 products a step). This kernel is one launch, with its k-split reduced inside it.

    out[m, n] = sum_k x[m, k] * w[n, k]

The tiling and the tensor-core loop are rows_mma.py's; this module supplies the weights: 64 k per
chunk, and at step j lane t reads w[n, c * 64 + 32j + 8t ...], 16 bytes, which are the 8 k that
rows_mma.py's fragment map gives it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from engine.runner.cuda import rows_mma, small_matmul

import mlx.core as mx
from mlx import nn

MIN_ROWS = small_matmul.MAX_ROWS + 1
CHUNK = 64  # k per step of a warp's loop
_CHECK_ROWS = (5, 8, 64, 100)  # one and two column tiles per warp, part-filled row tiles
_CHECK_TOLERANCE = 1e-2  # of the largest output, against MLX's product of the same bf16 operands

_WEIGHT_CHUNK = """
    struct Chunk { uint4 w[NT][2][JS]; };
    auto load = [&](int c, Chunk& b) {
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int r = 0; r < 2; ++r)
                #pragma unroll
                for (int j = 0; j < JS; ++j)
                    b.w[nt][r][j] = *reinterpret_cast<const uint4*>(
                        w + (size_t)row[nt][r] * K + c * CHUNK + j * 32 + t * 8);
    };
    auto fragments = [&](const Chunk& b, int j, unsigned int (&A)[2][NT][4]) {
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 lo = b.w[nt][0][j], hi = b.w[nt][1][j];  // weight rows g and g + 8
                A[h][nt][0] = h ? lo.z : lo.x;
                A[h][nt][1] = h ? hi.z : hi.x;
                A[h][nt][2] = h ? lo.w : lo.y;
                A[h][nt][3] = h ? hi.w : hi.y;
            }
    };
"""
_SOURCE = rows_mma.source(_WEIGHT_CHUNK)


@lru_cache(maxsize=1)
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="bf16_rows_matmul",
        input_names=["x", "w", "counters"],
        output_names=["part", "out"],
        source=_SOURCE,
    )


def matmul_t(x: mx.array, w: mx.array, arrivals: rows_mma.Arrivals) -> mx.array:
    """x (..., K) @ w.T for MIN_ROWS to 128 rows of bf16 x and bf16 w (N, K); `arrivals` is the
    layer's own."""
    n, k = w.shape
    rows = x.size // k
    assert MIN_ROWS <= rows <= rows_mma.MAX_ROWS and x.dtype == mx.bfloat16, (rows, x.dtype)
    slices = rows_mma.num_slices(n, k, rows, CHUNK, 2)
    return rows_mma.launch(_kernel(), x, [w], arrivals, n, [("JS", CHUNK // 32)], slices)


def refusal(linear: nn.Module) -> str | None:
    """Why the kernel cannot compute `linear` (small_matmul.py's few-row wrapper), or None."""
    if type(linear) is not small_matmul.SmallRowsLinear:
        return "not a plain bf16 projection"
    n, k = linear.weight.shape
    if k % CHUNK or n % 16:
        return f"K a multiple of {CHUNK} and N of 16 are needed"
    return None


class Bf16RowsLinear(nn.Module):
    """A bias-free bf16 projection: 2 to 4 rows through small_matmul.py, 5 to 128 through this kernel,
    others through MLX."""

    def __init__(self, linear: small_matmul.SmallRowsLinear):
        super().__init__()
        self.weight = linear.weight
        self.arrivals = rows_mma.Arrivals(linear.weight.shape[0])

    def __call__(self, x: mx.array) -> mx.array:
        rows = x.size // x.shape[-1]
        if MIN_ROWS <= rows <= rows_mma.MAX_ROWS and x.dtype == mx.bfloat16:
            return matmul_t(x, self.weight, self.arrivals)
        return small_matmul.matmul_t(x, self.weight)


def check(linear: small_matmul.SmallRowsLinear) -> str | None:
    """Runs the kernel against MLX's product on random rows; None where they agree."""
    fast = Bf16RowsLinear(linear)
    for rows in _CHECK_ROWS:
        x = mx.random.normal((rows, linear.weight.shape[1]), key=mx.random.key(rows)).astype(mx.bfloat16)
        try:
            got = fast(x).astype(mx.float32)
            want = (x @ linear.weight.T).astype(mx.float32)
            worst: float = (mx.abs(want - got).max() / mx.maximum(mx.abs(want).max(), 1e-6)).item()  # type: ignore[assignment]
        except Exception as exc:  # noqa: BLE001  (no CUDA backend, or the kernel does not build)
            return f"the kernel failed: {exc}"
        if not worst <= _CHECK_TOLERANCE:  # also catches NaN
            return f"{rows} rows differ from MLX's product by {worst:.3g} of the largest output"
    return None
