"""The tensor-core skeleton of the few-row product kernel (2 to 128 rows of bf16 x against a weight of N
output columns), for MLX's CUDA backend: tiling, the k-split and its reduction, the launch.

Owns no weight format: quantized_rows.py supplies how a lane loads a chunk of its weight rows and turns
step j of it into tensor-core fragments. Never runs on other devices.

    block   4 warps, each NT x 16 output columns n; blockIdx.y is a slice of K
    chunk   32 * JS k per loop step, the next chunk loaded while this one is multiplied
    mma     m16n8k16, A = 16 weight rows, B = 8 rows of x. A sum over k does not care about the order,
            so at step (j, h) fragment slots {2t, 2t+1} and {2t+8, 2t+9} (lane: g = lane / 4,
            t = lane % 4) hold physical k = c * CHUNK + 32j + 8t + 4h + {0, 1} and {2, 3}, in A and
            in B alike: a lane reads 16 contiguous bytes of x, and 8 contiguous k of each weight row
    split   with S slices, each warp writes float32 partial sums to `part` (S, M, N). Up to 32 rows
            (REDUCE) the last of a column tile's S warps to finish (counted in `counters`, which it
            resets to 0) adds them and writes the bf16 output: the product is one launch. Past 32
            rows MLX adds them (the last warp alone would take longer: measured on an H200). Either
            way the slices are added in a fixed order, so a row's output does not depend on
            scheduling. `counters` belongs to one layer: MLX's stream orders its calls, and a layer
            is called once per forward
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

MIN_ROWS, MAX_ROWS = 2, 128
MAX_REDUCE_TILES = 8  # MT * NT up to which the kernel adds its own slices (32 rows)
WARPS = 4
TARGET_BLOCKS = 400  # about three blocks per SM on an H100/H200, counting the k-split

_HEAD = """
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
    const int n0 = blockIdx.x * (64 * NT) + warp * (16 * NT);
    if (n0 >= N) return;
    constexpr int CHUNK = 32 * JS;
    const int S = gridDim.y, s = blockIdx.y, chunks = K / CHUNK;
    const int c_begin = s * chunks / S, c_end = (s + 1) * chunks / S;

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
"""

_LOOP = """
    Chunk cur, nxt;
    if (c_begin < c_end) load(c_begin, cur);
    for (int c = c_begin; c < c_end; ++c) {
        if (c + 1 < c_end) load(c + 1, nxt);
        #pragma unroll
        for (int j = 0; j < JS; ++j) {
            unsigned int A[2][NT][4];
            fragments(cur, j, A);
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                uint4 xv = make_uint4(0, 0, 0, 0);
                if (xrow[mt] != nullptr)
                    xv = *reinterpret_cast<const uint4*>(xrow[mt] + c * CHUNK + j * 32 + t * 8);
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
        cur = nxt;
    }
"""

# Fragment (mt, nt, i) of a lane is output row m = 8 mt + 2t + (i % 2), column n = n0 + 16 nt + g
# (+ 8 for i >= 2). The last warp of a tile reads the partial sums as float4s along n instead: lane
# (q = lane % 4NT, r0 = lane / 4NT) takes columns n0 + 4q ... + 3 of rows r0, r0 + 8 / NT, ..., so
# each slice is MT * NT coalesced loads per lane, U slices in flight at once.
_TAIL = """
    if (S == 1) {
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                #pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = mt * 8 + 2 * t + i % 2, n = n0 + nt * 16 + g + 8 * (i / 2);
                    if (m < M) out[(size_t)m * N + n] = __float2bfloat16(acc[mt][nt][i]);
                }
        return;
    }
    float* mine = part + (size_t)s * M * N;
    #pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = mt * 8 + 2 * t + i % 2, n = n0 + nt * 16 + g + 8 * (i / 2);
                if (m < M) mine[(size_t)m * N + n] = acc[mt][nt][i];
            }
    if (!REDUCE) return;
    __threadfence();
    __syncwarp();
    unsigned int* counter = const_cast<unsigned int*>(counters) + n0 / (16 * NT);
    unsigned int arrived = 0;
    if (lane == 0) arrived = atomicAdd(counter, 1u);
    if (__shfl_sync(0xffffffffu, arrived, 0) != (unsigned int)(S - 1)) return;
    __threadfence();
    constexpr int RS = 8 / NT;  // rows between a lane's rows
    const int q = lane % (4 * NT), r0 = lane / (4 * NT);
    constexpr int U = MT * NT <= 2 ? 8 : MT * NT <= 4 ? 4 : 2;  // slices read at once (MT * NT <= 8)
    float4 sum[MT * NT];
    #pragma unroll
    for (int e = 0; e < MT * NT; ++e) sum[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int r = 0; r < S; r += U) {  // added in slice order: the sum does not depend on which warp was last
        float4 v[U][MT * NT];
        #pragma unroll
        for (int u = 0; u < U; ++u)
            #pragma unroll
            for (int e = 0; e < MT * NT; ++e) {
                const int m = r0 + e * RS;
                v[u][e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (r + u < S && m < M)
                    v[u][e] = __ldcg(reinterpret_cast<const float4*>(
                        part + ((size_t)(r + u) * M + m) * N + n0 + 4 * q));
            }
        #pragma unroll
        for (int u = 0; u < U; ++u)
            #pragma unroll
            for (int e = 0; e < MT * NT; ++e) {
                sum[e].x += v[u][e].x; sum[e].y += v[u][e].y; sum[e].z += v[u][e].z; sum[e].w += v[u][e].w;
            }
    }
    #pragma unroll
    for (int e = 0; e < MT * NT; ++e) {
        const int m = r0 + e * RS;
        if (m < M) {
            __nv_bfloat162 pair[2] = {__floats2bfloat162_rn(sum[e].x, sum[e].y),
                                      __floats2bfloat162_rn(sum[e].z, sum[e].w)};
            *reinterpret_cast<uint2*>(out + (size_t)m * N + n0 + 4 * q) = *reinterpret_cast<uint2*>(pair);
        }
    }
    if (lane == 0) atomicExch(counter, 0u);
"""


def source(weight_chunk: str) -> str:
    """The kernel body around a weight format's code, which defines `struct Chunk`, `load(c, Chunk&)`
    and `fragments(const Chunk&, j, unsigned int (&A)[2][NT][4])` (slots as in the module's map)."""
    return _HEAD + weight_chunk + _LOOP + _TAIL


def tiles(rows: int) -> tuple[int, int]:
    """(MT, NT): 8-row tiles of x, and 16-column tiles of the weights per warp (fewer at 128 rows, so
    the accumulators stay in registers)."""
    mt = -(-rows // 8)
    return mt, 2 if mt <= 8 else 1


def num_slices(n: int, k: int, rows: int, chunk: int, weight_bytes: float) -> int:
    """How many slices K is split into: about TARGET_BLOCKS blocks, while the float32 partial sums,
    written and read back, stay under the weight's own bytes (`weight_bytes` per element)."""
    blocks = -(-n // (64 * tiles(rows)[1]))
    return max(1, min(k // chunk, -(-TARGET_BLOCKS // blocks), int(k * weight_bytes) // (8 * rows)))


def adds_own_slices(rows: int, slices: int) -> bool:
    """Whether the kernel adds its K slices itself (template REDUCE), or leaves them to MLX."""
    mt, nt = tiles(rows)
    return slices == 1 or mt * nt <= MAX_REDUCE_TILES


class Arrivals:
    """The arrival counters of one layer's product, one per column tile of the finest tiling; a plain
    attribute of the layer's module, not one of its parameters."""

    def __init__(self, n: int):
        self.counts = mx.zeros((-(-n // 16),), dtype=mx.uint32)
        mx.eval(self.counts)


def launch(
    kernel: Any,
    x: mx.array,
    weights: list[mx.array],
    arrivals: Arrivals,
    n: int,
    template: list[tuple[str, int]],
    slices: int,
) -> mx.array:
    """`kernel` over the rows of x (..., K); returns (..., n) in x's dtype."""
    k = x.shape[-1]
    rows = x.size // k
    mt, nt = tiles(rows)
    reduce = adds_own_slices(rows, slices)
    part, out = kernel(
        inputs=[x.reshape(rows, k), *weights, arrivals.counts],
        template=[("MT", mt), ("NT", nt), ("REDUCE", int(reduce)), *template],
        grid=(-(-n // (64 * nt)) * 32 * WARPS, slices, 1),
        threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[(slices, rows, n) if slices > 1 else (1,), (rows, n) if reduce else (1,)],
        output_dtypes=[mx.float32, mx.bfloat16],
    )
    if not reduce:
        out = part.sum(axis=0).astype(x.dtype)
    return out.reshape(*x.shape[:-1], n)
