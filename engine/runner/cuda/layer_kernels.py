"""The per-layer CUDA kernels of the fused decode (engine/runner/cuda/fused_decode.py), each with the MLX
operations it replaces beside it, so the same forward runs (and is tested) on any device.

Owns the kernel sources and their references; never chooses blocks and never runs a kernel off MLX's
CUDA backend. Why: a decode step on a GPU is bound by MLX's host cost per launched kernel (about 10 us
each), so the two launches of a residual add and an RMSNorm become one, and RoPE, the paged K/V write
and the attention (two ropes, two scatters, the attention and their index arithmetic) become one.

    add_rms_norm(r, d, w)   h = r + d (rounded to T, as MLX's add);  y = w * T(h * rsqrt(mean(h^2) + eps))
    rope_write_attend       per (row b, query head h): rotate q and the row's new k by the row's cos/sin,
                            write k and v at the row's slot of its kv head (in place, one writer per kv
                            head), attend over the row's `length` tokens of the pools through its block
                            table, the new token from registers rather than the pool

The attention kernel writes the pools it receives as inputs. MLX does not see that write, which is
safe because nothing else in the same evaluation touches those pools (the engine evaluates each forward
on its own, and each evaluation's kernels run after the previous one's on the stream), and because the
kernel reads only tokens written by earlier launches from the pools.
"""

from __future__ import annotations

from functools import lru_cache

from engine.runner.cuda.cuda_attention import WARP_MERGE

import mlx.core as mx

WARPS = 4
NORM_THREADS = 256

_ADD_RMS_NORM = """
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int H = w_shape[0];
    const T* rr = r + (size_t)row * H;
    const T* dd = d + (size_t)row * H;
    T* hh = h + (size_t)row * H;
    float ss = 0.0f;
    for (int i = tid; i < H; i += THREADS) {
        T v = static_cast<T>(static_cast<float>(rr[i]) + static_cast<float>(dd[i]));
        hh[i] = v;
        float f = static_cast<float>(v);
        ss += f * f;
    }
    __shared__ float partial[THREADS / 32];
    for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffff, ss, off);
    if (tid % 32 == 0) partial[tid / 32] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < THREADS / 32; ++i) total += partial[i];
    const float inv = rsqrtf(total / H + eps[0]);
    for (int i = tid; i < H; i += THREADS) {
        T normed = static_cast<T>(static_cast<float>(hh[i]) * inv);
        y[(size_t)row * H + i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
    }
"""

_ROPE_WRITE_ATTEND = (
    """
    const int bh = blockIdx.x;
    const int b = bh / NQ;
    const int h = bh % NQ;
    const int group = NQ / KVH;
    const int kvh = h / group;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    constexpr int PER = D / 32;
    constexpr int HALF = D / 2;
    const int max_blocks = table_shape[1];
    const int num_blocks = k_pool_shape[1];
    const T* row = qkv + (size_t)b * (NQ + 2 * KVH) * D;
    const T* qs = row + h * D;
    const T* ks = row + (NQ + kvh) * D;
    const T* vs = row + (NQ + KVH + kvh) * D;
    const float* c = cos_sin + (size_t)b * D;
    __shared__ float sq[D];
    __shared__ float sk[D];
    __shared__ float sv[D];
    for (int d = tid; d < D; d += blockDim.x) {
        int p;
        float cs, sn;
        bool first;
        if (TRADITIONAL) {
            cs = c[d & ~1]; sn = c[d | 1]; p = d ^ 1; first = (d & 1) == 0;
        } else {
            const int i = d % HALF;
            cs = c[i]; sn = c[i + HALF]; p = d < HALF ? d + HALF : d - HALF; first = d < HALF;
        }
        const float xq = static_cast<float>(qs[d]), pq = static_cast<float>(qs[p]);
        const float xk = static_cast<float>(ks[d]), pk = static_cast<float>(ks[p]);
        const float rq = first ? xq * cs - pq * sn : pq * sn + xq * cs;
        const float rk = first ? xk * cs - pk * sn : pk * sn + xk * cs;
        sq[d] = static_cast<float>(static_cast<T>(rq));
        sk[d] = static_cast<float>(static_cast<T>(rk));
        sv[d] = static_cast<float>(vs[d]);
    }
    __syncthreads();
    const int len = lengths[b];
    if (h % group == 0) {
        const size_t at = ((size_t)kvh * num_blocks * BS + slots[b]) * D;
        T* kw = const_cast<T*>(k_pool) + at;
        T* vw = const_cast<T*>(v_pool) + at;
        for (int d = tid; d < D; d += blockDim.x) {
            kw[d] = static_cast<T>(sk[d]);
            vw[d] = static_cast<T>(sv[d]);
        }
    }
    const float scale = scale_arr[0];
    float qv[PER], acc[PER];
    for (int i = 0; i < PER; ++i) {
        qv[i] = sq[lane * PER + i] * scale;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = warp; t < len; t += WARPS) {
        float kf[PER], vf[PER];
        if (t == len - 1) {
            for (int i = 0; i < PER; ++i) { kf[i] = sk[lane * PER + i]; vf[i] = sv[lane * PER + i]; }
        } else {
            const int blk = table[(size_t)b * max_blocks + t / BS];
            const size_t base = (((size_t)kvh * num_blocks + blk) * BS + t % BS) * D + lane * PER;
            for (int i = 0; i < PER; ++i) {
                kf[i] = static_cast<float>(k_pool[base + i]);
                vf[i] = static_cast<float>(v_pool[base + i]);
            }
        }
        float s = 0.0f;
        for (int i = 0; i < PER; ++i) s += qv[i] * kf[i];
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffff, s, off);
        const float m_new = fmaxf(m, s);
        const float corr = __expf(m - m_new);
        const float p = __expf(s - m_new);
        l = l * corr + p;
        for (int i = 0; i < PER; ++i) acc[i] = acc[i] * corr + p * vf[i];
        m = m_new;
    }
"""
    + WARP_MERGE
)


@lru_cache(maxsize=1)
def _add_rms_norm_kernel():
    return mx.fast.cuda_kernel(
        name="fused_add_rms_norm",
        input_names=["r", "d", "w", "eps"],
        output_names=["h", "y"],
        source=_ADD_RMS_NORM,
    )


@lru_cache(maxsize=1)
def _rope_write_attend_kernel():
    return mx.fast.cuda_kernel(
        name="fused_rope_write_attend",
        input_names=["qkv", "cos_sin", "k_pool", "v_pool", "table", "lengths", "slots", "scale_arr"],
        output_names=["out"],
        source=_ROPE_WRITE_ATTEND,
    )


class CudaKernels:
    """The kernels; pools come back as they went in (written in place)."""

    def add_rms_norm(self, r: mx.array, d: mx.array, w: mx.array, eps: float) -> tuple[mx.array, mx.array]:
        rows, hidden = r.shape
        h, y = _add_rms_norm_kernel()(
            inputs=[r, d, w, mx.array([eps], mx.float32)],
            template=[("T", r.dtype), ("THREADS", NORM_THREADS)],
            grid=(rows * NORM_THREADS, 1, 1),
            threadgroup=(NORM_THREADS, 1, 1),
            output_shapes=[(rows, hidden), (rows, hidden)],
            output_dtypes=[r.dtype, r.dtype],
        )
        return h, y

    def rope_write_attend(
        self, qkv: mx.array, cos_sin: mx.array, pools: tuple[mx.array, mx.array], step, attn
    ):
        k_pool, v_pool = pools
        rows = qkv.shape[0]
        num_kv, _, block_size, dim = k_pool.shape
        out = _rope_write_attend_kernel()(
            inputs=[
                qkv,
                cos_sin,
                k_pool,
                v_pool,
                step.table,
                step.lengths,
                step.slots,
                mx.array([attn.scale]),
            ],
            template=[
                ("T", qkv.dtype),
                ("D", dim),
                ("NQ", attn.n_heads),
                ("KVH", num_kv),
                ("BS", block_size),
                ("WARPS", WARPS),
                ("TRADITIONAL", attn.traditional),
            ],
            grid=(rows * attn.n_heads * 32 * WARPS, 1, 1),
            threadgroup=(32 * WARPS, 1, 1),
            output_shapes=[(rows, attn.n_heads * dim)],
            output_dtypes=[qkv.dtype],
        )[0]
        return out, pools


class ReferenceKernels:
    """The same contracts in MLX operations: what the kernels must equal, and the path off CUDA."""

    def add_rms_norm(self, r: mx.array, d: mx.array, w: mx.array, eps: float) -> tuple[mx.array, mx.array]:
        h = r + d
        return h, mx.fast.rms_norm(h, w, eps)

    def rope_write_attend(
        self, qkv: mx.array, cos_sin: mx.array, pools: tuple[mx.array, mx.array], step, attn
    ):
        k_pool, v_pool = pools
        rows = qkv.shape[0]
        num_kv, dim = k_pool.shape[0], k_pool.shape[-1]
        nq = attn.n_heads
        heads = qkv.reshape(rows, nq + 2 * num_kv, dim)
        q = rotate(heads[:, :nq], cos_sin, attn.traditional)
        k = rotate(heads[:, nq : nq + num_kv], cos_sin, attn.traditional)
        v = heads[:, nq + num_kv :]
        pools = (_write(k_pool, k, step.slots), _write(v_pool, v, step.slots))
        keys, values = (_context(pool, step.table) for pool in pools)
        positions = mx.arange(keys.shape[2], dtype=mx.int32)
        mask = (positions[None, :] < step.lengths[:, None])[:, None, None, :]
        out = mx.fast.scaled_dot_product_attention(
            q[:, :, None, :], keys, values, scale=attn.scale, mask=mask
        )
        return out.reshape(rows, nq * dim), pools


def rotate(x: mx.array, cos_sin: mx.array, traditional: bool) -> mx.array:
    """x (B, heads, D) rotated by each row's cos/sin (B, D), laid out as RoPE on a basis leaves them
    (engine/runner/cuda/fused_decode.py): cos then sin per frequency, interleaved if `traditional`."""
    rows, heads, dim = x.shape
    xf = x.astype(mx.float32)
    if traditional:
        cs = cos_sin.reshape(rows, 1, dim // 2, 2)
        pairs = xf.reshape(rows, heads, dim // 2, 2)
        x1, x2, c, s = pairs[..., 0], pairs[..., 1], cs[..., 0], cs[..., 1]
        return mx.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(x.shape).astype(x.dtype)
    half = dim // 2
    c, s = cos_sin[:, None, :half], cos_sin[:, None, half:]
    x1, x2 = xf[..., :half], xf[..., half:]
    return mx.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).astype(x.dtype)


def _write(pool: mx.array, new: mx.array, slots: mx.array) -> mx.array:
    """new (B, kv heads, D) into each row's slot of every head of pool (kv heads, blocks, block size, D)."""
    heads, num_blocks, block_size, dim = pool.shape
    flat = pool.reshape(heads, num_blocks * block_size, dim)
    flat[:, slots] = new.transpose(1, 0, 2)
    return flat.reshape(pool.shape)


def _context(pool: mx.array, table: mx.array) -> mx.array:
    """(B, kv heads, width * block size, D): each row's blocks, in table order."""
    heads, _, block_size, dim = pool.shape
    rows, width = table.shape
    blocks = pool[:, table]  # (heads, B, width, block size, D)
    return blocks.transpose(1, 0, 2, 3, 4).reshape(rows, heads, width * block_size, dim)
