"""Paged decode attention as one CUDA kernel (MLX's `mx.fast.cuda_kernel`), for MLX's CUDA backend only.

Owns the kernel source; engine/runner/attention_hook.py routes a paged decode layer's attention to it. Never writes
the KV pools (the cache scatters the new K/V first) and never runs on other devices, where the
portable path (gather the context through the block table, then `mx.fast.scaled_dot_product_attention`)
stays in use.

Why: on CUDA, MLX's portable path costs a dozen small kernels per layer (index arithmetic, two
gathers, the mask, attention) and each kernel's launch costs more than its work at decode sizes.
The kernel reads K/V straight from the pools through the block table:

    one thread block per (row b, query head h), 4 warps; kv head = h // (query heads / kv heads)
    warp w takes context tokens t = w, w + 4, ...  (t < length[b]); lane i holds dims [i*D/32, (i+1)*D/32)
    token t lives at pool[kv_head, table[b][t // block_size], t % block_size, :]
    each warp keeps an online softmax (max, sum, weighted V); the 4 are merged in shared memory
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx

_WARPS = 4

# Merges the warps' online-softmax partials (max m, sum l, weighted V acc) of one (row, head) and
# writes out[bh]; shared with engine/runner/cuda/layer_kernels.py's fused attention.
WARP_MERGE = """\
    __shared__ float sm_m[WARPS];
    __shared__ float sm_l[WARPS];
    __shared__ float sm_acc[WARPS][D];
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
    for (int i = 0; i < PER; ++i) sm_acc[warp][lane * PER + i] = acc[i];
    __syncthreads();
    if (warp == 0) {
        float big = sm_m[0];
        for (int w = 1; w < WARPS; ++w) big = fmaxf(big, sm_m[w]);
        float total = 0.0f, weight[WARPS];
        for (int w = 0; w < WARPS; ++w) {
            weight[w] = sm_m[w] == -INFINITY ? 0.0f : __expf(sm_m[w] - big);
            total += sm_l[w] * weight[w];
        }
        for (int i = 0; i < PER; ++i) {
            const int d = lane * PER + i;
            float o = 0.0f;
            for (int w = 0; w < WARPS; ++w) o += sm_acc[w][d] * weight[w];
            out[(size_t)bh * D + d] = static_cast<T>(o / total);
        }
    }
"""

_SOURCE = (
    """
    const int bh = blockIdx.x;
    const int b = bh / NQ;
    const int h = bh % NQ;
    const int kvh = h / (NQ / KVH);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    constexpr int PER = D / 32;
    const int max_blocks = table_shape[1];
    const int num_blocks = k_pool_shape[1];
    const int len = lengths[b];
    const float scale = scale_arr[0];
    float qv[PER], acc[PER];
    for (int i = 0; i < PER; ++i) {
        qv[i] = static_cast<float>(q[(size_t)bh * D + lane * PER + i]) * scale;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = warp; t < len; t += WARPS) {
        const int blk = table[(size_t)b * max_blocks + t / BS];
        const size_t base = (((size_t)kvh * num_blocks + blk) * BS + t % BS) * D + lane * PER;
        float s = 0.0f;
        for (int i = 0; i < PER; ++i) s += qv[i] * static_cast<float>(k_pool[base + i]);
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffff, s, off);
        const float m_new = fmaxf(m, s);
        const float corr = __expf(m - m_new);
        const float p = __expf(s - m_new);
        l = l * corr + p;
        for (int i = 0; i < PER; ++i) acc[i] = acc[i] * corr + p * static_cast<float>(v_pool[base + i]);
        m = m_new;
    }
"""
    + WARP_MERGE
)


def kernel_available() -> bool:
    """True where the paged decode kernel can run: MLX's CUDA backend, with the GPU the default device."""
    return mx.cuda.is_available() and mx.default_device().type == mx.DeviceType.gpu


def supports(head_dim: int, dtype: mx.Dtype) -> bool:
    return head_dim % 32 == 0 and head_dim <= 256 and dtype in (mx.bfloat16, mx.float16, mx.float32)


@lru_cache(maxsize=1)
def _kernel():
    return mx.fast.cuda_kernel(
        name="paged_decode_attention",
        input_names=["q", "k_pool", "v_pool", "table", "lengths", "scale_arr"],
        output_names=["out"],
        source=_SOURCE,
    )


def paged_decode_attention(
    queries: mx.array, k_pool: mx.array, v_pool: mx.array, table: mx.array, lengths: mx.array, scale: float
) -> mx.array:
    """queries (B, NQ, 1, D); pools (KVH, num_blocks, block_size, D); table (B, max_blocks) int32;
    lengths (B,) int32 tokens of context per row (the new one included). Returns (B, NQ, 1, D)."""
    batch, num_q, _, dim = queries.shape
    num_kv, _, block_size, _ = k_pool.shape
    out = _kernel()(
        inputs=[queries.reshape(batch, num_q, dim), k_pool, v_pool, table, lengths, mx.array([scale])],
        template=[
            ("T", queries.dtype),
            ("D", dim),
            ("NQ", num_q),
            ("KVH", num_kv),
            ("BS", block_size),
            ("WARPS", _WARPS),
        ],
        grid=(batch * num_q * 32 * _WARPS, 1, 1),
        threadgroup=(32 * _WARPS, 1, 1),
        output_shapes=[(batch, num_q, dim)],
        output_dtypes=[queries.dtype],
    )[0]
    return out.reshape(batch, num_q, 1, dim)
