"""Products of 2 to 128 rows with 4-bit affine weights (mlx-lm's quantization) as one tensor-core kernel,
for MLX's CUDA backend.

Owns the kernel, its load-time check and the rewrite of a loaded model's `nn.QuantizedLinear` layers;
never runs on other devices and never touches one row (MLX's matrix-vector product serves it) or more
than 128 (a prefill: MLX's quantized GEMM). Why: with MLX's quantized matmul the fused decode of an
8B-shaped 4-bit model ran at 2,688 tok/s at batch 64 (6.5% of the bandwidth roofline); with this kernel,
5,750 in the same H200 run (docs/benchmarks.md). Each code is read once per step and dequantized in
registers straight into the tensor cores' fragments:

    out[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, k / GS] + bias[n, k / GS])

The tiling, the k-split and the tensor-core loop are rows_mma.py's; this module supplies the codes:
128 k per chunk, lane t reads the 4-byte words 4j + t (j = 0..3) of its weight rows, which hold
exactly the 8 k that rows_mma.py's fragment map gives it at step j, so every lane dequantizes only codes
it loaded itself.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from engine.runner.cuda import rows_mma
from engine.runner.cuda.fused_projections import fused_products
from engine.runner.cuda.rows_mma import MAX_ROWS, MIN_ROWS
from engine.runner.cuda.small_matmul import small_rows

import mlx.core as mx
from mlx import nn

logger = logging.getLogger(__name__)

BITS = 4
CHUNK = 128  # k per step of a warp's loop
_CHECK_ROWS = (2, 7, 64, 100)  # one and two column tiles per warp, part-filled row tiles
_CHECK_TOLERANCE = 1e-2  # of the largest output, against mx.quantized_matmul on the same codes

_WEIGHT_CHUNK = """
    constexpr int GPC = CHUNK / GS;  // scale groups per chunk
    const int KW = K / 8, G = scales_shape[1];
    struct Chunk { unsigned int q[NT][2][JS]; float sc[NT][2][GPC], bi[NT][2][GPC]; };
    auto load = [&](int c, Chunk& b) {
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                const unsigned int* wr = w + (size_t)row[nt][r] * KW + c * (CHUNK / 8) + t;
                #pragma unroll
                for (int j = 0; j < JS; ++j) b.q[nt][r][j] = wr[4 * j];
                #pragma unroll
                for (int i = 0; i < GPC; ++i) {
                    b.sc[nt][r][i] = static_cast<float>(scales[(size_t)row[nt][r] * G + c * GPC + i]);
                    b.bi[nt][r][i] = static_cast<float>(biases[(size_t)row[nt][r] * G + c * GPC + i]);
                }
            }
    };
    // word j of a row holds the codes of k = 32j + 8t ... 32j + 8t + 7, four bits each, lowest first
    auto fragments = [&](const Chunk& b, int j, unsigned int (&A)[2][NT][4]) {
        const int gi = j * 32 / GS;
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const unsigned int qa = b.q[nt][0][j] >> (16 * h), qb = b.q[nt][1][j] >> (16 * h);
                const float s0 = b.sc[nt][0][gi], b0 = b.bi[nt][0][gi];
                const float s1 = b.sc[nt][1][gi], b1 = b.bi[nt][1][gi];
                __nv_bfloat162 p;
                p = __floats2bfloat162_rn((qa & 15) * s0 + b0, ((qa >> 4) & 15) * s0 + b0);
                A[h][nt][0] = *reinterpret_cast<unsigned int*>(&p);
                p = __floats2bfloat162_rn((qb & 15) * s1 + b1, ((qb >> 4) & 15) * s1 + b1);
                A[h][nt][1] = *reinterpret_cast<unsigned int*>(&p);
                p = __floats2bfloat162_rn(((qa >> 8) & 15) * s0 + b0, ((qa >> 12) & 15) * s0 + b0);
                A[h][nt][2] = *reinterpret_cast<unsigned int*>(&p);
                p = __floats2bfloat162_rn(((qb >> 8) & 15) * s1 + b1, ((qb >> 12) & 15) * s1 + b1);
                A[h][nt][3] = *reinterpret_cast<unsigned int*>(&p);
            }
    };
"""
_SOURCE = rows_mma.source(_WEIGHT_CHUNK)


@lru_cache(maxsize=1)
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="quantized_rows_matmul",
        input_names=["x", "w", "scales", "biases", "counters"],
        output_names=["part", "out"],
        source=_SOURCE,
    )


def matmul_t(
    x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, arrivals: rows_mma.Arrivals
) -> mx.array:
    """x (..., K) @ dequantize(w).T for 2 to 128 rows of bf16 x; 4-bit affine codes (N, K / 8) uint32;
    `arrivals` is the layer's own."""
    n, k = w.shape[0], x.shape[-1]
    rows = x.size // k
    assert MIN_ROWS <= rows <= MAX_ROWS and x.dtype == mx.bfloat16, (rows, x.dtype)
    group_size = k // scales.shape[1]
    slices = rows_mma.num_slices(n, k, rows, CHUNK, BITS / 8)
    template = [("JS", CHUNK // 32), ("GS", group_size)]
    return rows_mma.launch(_kernel(), x, [w, scales, biases], arrivals, n, template, slices)


def refusal(linear: nn.Module) -> str | None:
    """Why the kernel cannot compute `linear`, or None."""
    if type(linear) is not nn.QuantizedLinear:
        return "not an nn.QuantizedLinear"
    if linear.bits != BITS or getattr(linear, "mode", "affine") != "affine" or "biases" not in linear:
        return f"not {BITS}-bit affine"
    n, k = linear.weight.shape[0], linear.weight.shape[1] * 32 // BITS
    if linear.group_size not in (32, 64, 128) or k % CHUNK or n % 16 or linear.scales.dtype != mx.bfloat16:
        return "groups of 32, 64 or 128, K a multiple of 128, N of 16 and bf16 scales are needed"
    return None


class QuantizedRowsLinear(nn.Module):
    """An `nn.QuantizedLinear` whose 2-to-128-row products go through the kernel."""

    def __init__(self, linear: nn.QuantizedLinear):
        super().__init__()
        self.inner = linear
        self.arrivals = rows_mma.Arrivals(linear.weight.shape[0])

    def __call__(self, x: mx.array) -> mx.array:
        rows = x.size // x.shape[-1]
        if not MIN_ROWS <= rows <= MAX_ROWS or x.dtype != mx.bfloat16:
            return self.inner(x)
        inner = self.inner
        out = matmul_t(x, inner.weight, inner.scales, inner.biases, self.arrivals)
        return out + inner.bias if "bias" in inner else out


def check(linear: nn.QuantizedLinear) -> str | None:
    """Runs the kernel against `mx.quantized_matmul` on random rows, one layer's calls in a row (so each
    call also relies on the last one's counters being reset); None where they agree."""
    k = linear.weight.shape[1] * 32 // BITS
    fast = QuantizedRowsLinear(linear)
    for rows in _CHECK_ROWS:
        x = mx.random.normal((rows, k), key=mx.random.key(rows)).astype(mx.bfloat16)
        try:
            got = fast(x).astype(mx.float32)
            want = linear(x).astype(mx.float32)
            worst: float = (mx.abs(want - got).max() / mx.maximum(mx.abs(want).max(), 1e-6)).item()  # type: ignore[assignment]
        except Exception as exc:  # noqa: BLE001  (no CUDA backend, or the kernel does not build)
            return f"the kernel failed: {exc}"
        if not worst <= _CHECK_TOLERANCE:  # also catches NaN
            return f"{rows} rows differ from mx.quantized_matmul by {worst:.3g} of the largest output"
    return None


class QuantizedRowsUse:
    """The wrap a CUDA decode path builds its products with: bf16 ones through small_matmul.py, 4-bit
    ones (with `on`) through this kernel where `refusal` and `check` allow. Counts what it took and what
    it left to MLX, for `/v1/status` (`summary`)."""

    def __init__(self, on: bool):
        self.on = on
        self._taken: set[int] = set()  # ids of the kernel's wrappers serving this build's model
        self.kept: dict[str, int] = {}  # why a 4-bit layer keeps MLX's product -> how many
        # `check` once per weight shape and group size: the kernel's code path depends on nothing else.
        self._checked: dict[tuple[int, int, int], str | None] = {}

    def __call__(self, linear: nn.Module) -> nn.Module:
        return self.take(small_rows(linear))

    def take(self, linear: nn.Module) -> nn.Module:
        """`linear` itself, or the same product through the kernel."""
        if not self.on or type(linear) is not nn.QuantizedLinear:
            return linear
        reason = refusal(linear) or self._check(linear)
        if reason is not None:
            self.kept[reason] = self.kept.get(reason, 0) + 1
            logger.warning("4-bit rows kernel not used for a %s layer: %s", linear.weight.shape, reason)
            return linear
        fast = QuantizedRowsLinear(linear)
        self._taken.add(id(fast))
        return fast

    @property
    def num_taken(self) -> int:
        return len(self._taken)

    def _check(self, linear: nn.QuantizedLinear) -> str | None:
        key = (linear.weight.shape[0], linear.weight.shape[1], linear.group_size)
        if key not in self._checked:
            self._checked[key] = check(linear)
        return self._checked[key]

    def rewrite(self, model: nn.Module) -> None:
        """Takes every `nn.QuantizedLinear` under `model` that is a module's child (or in its list), and
        counts the kernel's wrappers already there (a path built before this one may have made them)."""
        if not self.on:
            return
        self._taken.update(id(m) for m in fused_products(model) if isinstance(m, QuantizedRowsLinear))
        for _, module in list(model.named_modules()):
            if isinstance(module, QuantizedRowsLinear):
                self._taken.add(id(module))
                continue
            for name, child in list(module.children().items()):
                if isinstance(child, nn.Module) and (fast := self.take(child)) is not child:
                    setattr(module, name, fast)
                elif isinstance(child, list):  # e.g. nn.Sequential's layers (children() lists a copy)
                    items = module[name]
                    for i, item in enumerate(items):
                        if isinstance(item, nn.Module) and (fast := self.take(item)) is not item:
                            items[i] = fast

    @property
    def summary(self) -> str:
        if not self.on:
            return "off (engine.cuda_quantized_rows is false)"
        total = self.num_taken + sum(self.kept.values())
        if total == 0:
            return "no quantized products"
        kept = "".join(f"; {n} keep MLX's: {reason}" for reason, n in self.kept.items())
        return f"{self.num_taken} of {total} quantized products{kept}"
