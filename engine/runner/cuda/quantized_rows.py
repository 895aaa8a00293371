"""Products of 2 to 128 rows with 4-bit affine weights (mlx-lm's quantization) as one tensor-core kernel,
for MLX's CUDA backend.

Owns the kernel, its load-time check and the rewrite of a loaded model's `nn.QuantizedLinear` layers;
never runs on other devices and never touches one row (MLX's matrix-vector product serves it) or more
than 128 (a prefill: MLX's quantized GEMM). Why: with MLX's quantized matmul the fused decode of an
8B-shaped 4-bit model ran at 2,688 tok/s at batch 64 (6.5% of the bandwidth roofline); with this kernel,
5,750 in the same H200 run (docs/benchmarks.md). Each code is read once per step and dequantized in
registers straight into the tensor cores' fragments:

    out[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, k / GS] + bias[n, k / GS])

    block   4 warps, each NT x 16 output columns n; blockIdx.y is a slice of K (partial sums (S, M, N)
            in float32, added by MLX in a fixed order, so a row's output does not depend on scheduling)
    chunk   128 k per loop step; lane (g = lane / 4, t = lane % 4) reads the 4-byte words
            c * 16 + 4j + t (j = 0..3) of weight rows g and g + 8 of each column tile, and the 16 bytes
            x[m, c * 128 + 32j + 8t ...] of x rows m = 8 * mt + g
    mma     m16n8k16, A = 16 weight rows, B = 8 rows of x. A sum over k does not care about the order,
            so at step (j, h) fragment slots {2t, 2t+1} and {2t+8, 2t+9} hold physical
            k = c * 128 + 32j + 8t + 4h + {0, 1} and {2, 3}, in A and in B alike: every lane dequantizes
            only codes it loaded itself, and the four lanes of a row read x contiguously
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from engine.runner.cuda.fused_projections import fused_products
from engine.runner.cuda.small_matmul import small_rows

import mlx.core as mx
from mlx import nn

logger = logging.getLogger(__name__)

MIN_ROWS, MAX_ROWS = 2, 128
BITS = 4
CHUNK = 128  # k per step of a warp's loop
WARPS = 4
TARGET_BLOCKS = 400  # about three blocks per SM on an H100/H200, counting the k-split
_CHECK_ROWS = (2, 7, 64, 100)  # one and two column tiles per warp, part-filled row tiles
_CHECK_TOLERANCE = 1e-2  # of the largest output, against mx.quantized_matmul on the same codes

_SOURCE = """
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
    const int KW = K / 8, G = scales_shape[1];
    const int n0 = blockIdx.x * (64 * NT) + warp * (16 * NT);
    if (n0 >= N) return;
    const int S = gridDim.y, s = blockIdx.y, chunks = K / 128;
    const int c_begin = s * chunks / S, c_end = (s + 1) * chunks / S;
    constexpr int GPC = 128 / GS;  // scale groups per chunk

    int row[NT][2];
    #pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        row[nt][0] = min(n0 + nt * 16 + g, N - 1);
        row[nt][1] = min(n0 + nt * 16 + g + 8, N - 1);
    }
    const __nv_bfloat16* xrow[MT];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) xrow[mt] = mt * 8 + g < M ? x + (size_t)(mt * 8 + g) * K : nullptr;

    float acc[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

    unsigned int wq[NT][2][4], wn[NT][2][4];
    float sc[NT][2][GPC], bi[NT][2][GPC], sn[NT][2][GPC], bn[NT][2][GPC];
    auto load = [&](int c, unsigned int (&q)[NT][2][4], float (&sq)[NT][2][GPC], float (&bq)[NT][2][GPC]) {
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                const unsigned int* wr = w + (size_t)row[nt][r] * KW + c * 16 + t;
                #pragma unroll
                for (int j = 0; j < 4; ++j) q[nt][r][j] = wr[4 * j];
                #pragma unroll
                for (int i = 0; i < GPC; ++i) {
                    sq[nt][r][i] = static_cast<float>(scales[(size_t)row[nt][r] * G + c * GPC + i]);
                    bq[nt][r][i] = static_cast<float>(biases[(size_t)row[nt][r] * G + c * GPC + i]);
                }
            }
    };
    if (c_begin < c_end) load(c_begin, wq, sc, bi);

    for (int c = c_begin; c < c_end; ++c) {
        if (c + 1 < c_end) load(c + 1, wn, sn, bn);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int gi = j * 32 / GS;
            unsigned int A[2][NT][4];
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const unsigned int qa = wq[nt][0][j] >> (16 * h), qb = wq[nt][1][j] >> (16 * h);
                    const float s0 = sc[nt][0][gi], b0 = bi[nt][0][gi], s1 = sc[nt][1][gi], b1 = bi[nt][1][gi];
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
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                uint4 xv = make_uint4(0, 0, 0, 0);
                if (xrow[mt] != nullptr)
                    xv = *reinterpret_cast<const uint4*>(xrow[mt] + c * 128 + j * 32 + t * 8);
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const unsigned int b0 = h ? xv.z : xv.x, b1 = h ? xv.w : xv.y;
                    #pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        asm volatile(
                            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n"
                            : "+f"(acc[mt][nt][0]), "+f"(acc[mt][nt][1]), "+f"(acc[mt][nt][2]),
                              "+f"(acc[mt][nt][3])
                            : "r"(A[h][nt][0]), "r"(A[h][nt][1]), "r"(A[h][nt][2]), "r"(A[h][nt][3]),
                              "r"(b0), "r"(b1));
                }
            }
        }
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                #pragma unroll
                for (int j = 0; j < 4; ++j) wq[nt][r][j] = wn[nt][r][j];
                #pragma unroll
                for (int i = 0; i < GPC; ++i) { sc[nt][r][i] = sn[nt][r][i]; bi[nt][r][i] = bn[nt][r][i]; }
            }
    }
    float* part = out + (size_t)s * M * N;
    #pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n = n0 + nt * 16 + g;
        if (n >= N) continue;
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int m = mt * 8 + 2 * t + i;
                if (m < M) {
                    part[(size_t)m * N + n] = acc[mt][nt][i];
                    part[(size_t)m * N + n + 8] = acc[mt][nt][2 + i];
                }
            }
    }
"""


@lru_cache(maxsize=1)
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="quantized_rows_matmul",
        input_names=["x", "w", "scales", "biases"],
        output_names=["out"],
        source=_SOURCE,
    )


def tiles(rows: int) -> tuple[int, int]:
    """(MT, NT): 8-row tiles of x, and 16-column tiles of the weights per warp (fewer at 128 rows, so
    the accumulators stay in registers)."""
    mt = -(-rows // 8)
    return mt, 2 if mt <= 8 else 1


def num_slices(n: int, k: int, rows: int) -> int:
    """How many slices K is split into: about TARGET_BLOCKS blocks, while the float32 partial sums,
    written and read back, stay under the codes' own bytes."""
    blocks = -(-n // (64 * tiles(rows)[1]))
    return max(1, min(k // CHUNK, -(-TARGET_BLOCKS // blocks), k // (16 * rows)))


def matmul_t(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
    """x (..., K) @ dequantize(w).T for 2 to 128 rows of bf16 x; 4-bit affine codes (N, K / 8) uint32."""
    n, k = w.shape[0], x.shape[-1]
    rows = x.size // k
    assert MIN_ROWS <= rows <= MAX_ROWS and x.dtype == mx.bfloat16, (rows, x.dtype)
    mt, nt = tiles(rows)
    slices = num_slices(n, k, rows)
    partial = _kernel()(
        inputs=[x.reshape(rows, k), w, scales, biases],
        template=[("MT", mt), ("NT", nt), ("GS", k // scales.shape[1])],
        grid=(-(-n // (64 * nt)) * 32 * WARPS, slices, 1),
        threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[(slices, rows, n)],
        output_dtypes=[mx.float32],
    )[0]
    out = partial[0] if slices == 1 else partial.sum(axis=0)
    return out.astype(x.dtype).reshape(*x.shape[:-1], n)


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

    def __call__(self, x: mx.array) -> mx.array:
        rows = x.size // x.shape[-1]
        if not MIN_ROWS <= rows <= MAX_ROWS or x.dtype != mx.bfloat16:
            return self.inner(x)
        inner = self.inner
        out = matmul_t(x, inner.weight, inner.scales, inner.biases)
        return out + inner.bias if "bias" in inner else out


def check(linear: nn.QuantizedLinear) -> str | None:
    """Runs the kernel against `mx.quantized_matmul` on random rows; None where they agree."""
    k = linear.weight.shape[1] * 32 // BITS
    for rows in _CHECK_ROWS:
        x = mx.random.normal((rows, k), key=mx.random.key(rows)).astype(mx.bfloat16)
        try:
            got = QuantizedRowsLinear(linear)(x).astype(mx.float32)
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
                elif isinstance(child, list):  # e.g. nn.Sequential's layers
                    for i, item in enumerate(child):
                        if isinstance(item, nn.Module) and (fast := self.take(item)) is not item:
                            child[i] = fast

    @property
    def summary(self) -> str:
        if not self.on:
            return "off (engine.cuda_quantized_rows is false)"
        total = self.num_taken + sum(self.kept.values())
        if total == 0:
            return "no quantized products"
        kept = "".join(f"; {n} keep MLX's: {reason}" for reason, n in self.kept.items())
        return f"{self.num_taken} of {total} quantized products{kept}"
