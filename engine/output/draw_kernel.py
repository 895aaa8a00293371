"""A mixed batch's choice of tokens as one CUDA kernel (MLX's `mx.fast.cuda_kernel`): argmax for greedy
rows, temperature, top_p and min_p then an inverse-CDF draw for the others, one thread block per row.

Owns the kernel, a NumPy mirror of its arithmetic, and the load-time check that it chooses what the
device sampler's MLX operations choose (engine/output/device_filters.py); never edits logits (masks, bias
and penalties come first, as there) and never runs off MLX's CUDA backend. Rows with top_k keep the MLX
operations.

Why: on a GPU a step is bound by MLX's host cost per launched kernel, and the MLX operations of a
sampled row's filters and draw are about forty kernels (a sort, prefix sums, gathers, compares). In a
batch of 64 with one row in five sampled they took an H200 step from about 0.2 to 1.3 ms of sampling.

The arithmetic, per row (weights w = exp((x - max) * inv_temp), so the best token weighs 1):
- masses are fixed point, w * 2^40 truncated to an integer (weights under 2^-40 weigh nothing; a row's
  ~128k of them are at most 1e-7 of its mass), so every sum is exact and its order does not matter:
  the same row gives the same token whatever the batch, the block size or the run;
- top_p's cut-off is the smallest weight c with mass(w > c) < P <= mass(w >= c), P = top_p * total:
  the tokens a descending sort would keep while the mass ranked above them is below P, ties at the
  cut-off all kept, as `_rank_cut`. It is found by radix select over the weights' float bit patterns
  (monotone for w >= 0), 4 bits a pass, each pass a histogram of mass;
- min_p keeps w >= min_p;
- the draw takes the first token in vocabulary order whose running kept mass exceeds u * kept mass.
The MLX operations compute the same in float32, so the two can part only where float rounding moves a
boundary (a cut-off or the draw's target) across a token: rare, most often in flat distributions of
thousands of kept tokens (1 row in 480 of tests/engine/output/test_draw_kernel.py's random batches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache

from engine.messages import SamplingParams
from engine.output.device_filters import choose_tokens
from engine.output.sampler import GREEDY_TEMPERATURE, SamplingRow

import mlx.core as mx
import numpy as np

logger = logging.getLogger(__name__)

THREADS = 1024
# (B, vocab) float32 edited logits and `row_params`'s (B, 4) -> (B,) int32 tokens: the kernel, or in the
# tests its NumPy mirror.
Draw = Callable[[mx.array, np.ndarray], mx.array]
_FIXED = float(2**40)

_SOURCE = """
    constexpr int W = THREADS / 32;
    constexpr float FIXED = 1099511627776.0f;  // 2^40
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int V = logits_shape[1];
    const float* x = logits + (size_t)row * V;
    const float inv_t = params[row * 4 + 0];
    const float top_p = params[row * 4 + 1];
    const float min_p = params[row * 4 + 2];
    const float u = params[row * 4 + 3];
    __shared__ float s_best[W];
    __shared__ int s_arg[W];
    __shared__ unsigned long long hist[16];
    __shared__ unsigned long long s_digits[W][16];
    __shared__ unsigned long long s_warp[W];
    __shared__ unsigned int s_prefix;
    __shared__ unsigned long long s_above;
    __shared__ unsigned long long s_p;
    __shared__ int s_choice;

    // The best logit, lowest id on ties.
    float best = tid < V ? x[tid] : -INFINITY;
    int arg = tid < V ? tid : V;
    for (int i = tid + THREADS; i < V; i += THREADS) {
        const float v = x[i];
        if (v > best) { best = v; arg = i; }
    }
    for (int off = 16; off > 0; off /= 2) {
        const float ob = __shfl_xor_sync(0xffffffff, best, off);
        const int oa = __shfl_xor_sync(0xffffffff, arg, off);
        if (ob > best || (ob == best && oa < arg)) { best = ob; arg = oa; }
    }
    if (lane == 0) { s_best[warp] = best; s_arg[warp] = arg; }
    __syncthreads();
    best = s_best[0];
    arg = s_arg[0];
    for (int w = 1; w < W; ++w) {
        if (s_best[w] > best || (s_best[w] == best && s_arg[w] < arg)) { best = s_best[w]; arg = s_arg[w]; }
    }
    if (arg >= V) arg = 0;
    if (inv_t == 0.0f) {
        if (tid == 0) out[row] = arg;
        return;
    }

    // top_p's cut-off by radix select over the weights' bit patterns, 4 bits a pass: each thread sums its
    // tokens' masses per digit in registers, then the block adds them up (integers: in any order, the
    // same sums). No shared atomics: a few bins take most of the row, and atomics would queue on them.
    unsigned int cut = 0;
    if (top_p < 1.0f) {
        unsigned int prefix = 0;
        for (int shift = 28; shift >= 0; shift -= 4) {
            const unsigned int high = shift == 28 ? 0u : 0xFFFFFFFFu << (shift + 4);
            unsigned long long acc[16];
            #pragma unroll
            for (int d = 0; d < 16; ++d) acc[d] = 0;
            for (int i = tid; i < V; i += THREADS) {
                const float w = expf((x[i] - best) * inv_t);
                const unsigned int bits = __float_as_uint(w);
                if ((bits & high) == prefix) {
                    const unsigned long long m = (unsigned long long)(w * FIXED);
                    const unsigned int digit = (bits >> shift) & 15u;
                    #pragma unroll
                    for (int d = 0; d < 16; ++d) acc[d] += digit == (unsigned int)d ? m : 0ull;
                }
            }
            #pragma unroll
            for (int d = 0; d < 16; ++d) {
                unsigned long long v = acc[d];
                for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffff, v, off);
                if (lane == 0) s_digits[warp][d] = v;
            }
            __syncthreads();
            if (tid < 16) {
                unsigned long long v = 0;
                for (int w = 0; w < W; ++w) v += s_digits[w][tid];
                hist[tid] = v;
            }
            __syncthreads();
            if (tid == 0) {
                if (shift == 28) {
                    unsigned long long total = 0;
                    for (int d = 0; d < 16; ++d) total += hist[d];
                    unsigned long long p = (unsigned long long)((double)top_p * (double)total);
                    s_p = p ? p : 1ull;  // the best token always stays
                    s_above = 0;
                }
                unsigned long long cum = s_above;
                int d = 15;
                for (; d > 0; --d) {
                    if (cum + hist[d] >= s_p) break;
                    cum += hist[d];
                }
                s_above = cum;
                s_prefix = prefix | ((unsigned int)d << shift);
            }
            __syncthreads();
            prefix = s_prefix;
        }
        cut = prefix;
    }

    // Kept mass per warp: warp w takes tokens [w * seg, (w + 1) * seg), its lanes 32 apart (coalesced);
    // an exclusive sum over the warps, then the warp holding the target walks its tokens 32 at a time.
    const int seg = (V + W - 1) / W;
    const int lo = min(V, warp * seg), hi = min(V, lo + seg);
    unsigned long long mine = 0;
    for (int i = lo + lane; i < hi; i += 32) {
        const float w = expf((x[i] - best) * inv_t);
        if (__float_as_uint(w) >= cut && w >= min_p) mine += (unsigned long long)(w * FIXED);
    }
    for (int off = 16; off > 0; off /= 2) mine += __shfl_xor_sync(0xffffffff, mine, off);
    if (lane == 0) s_warp[warp] = mine;
    if (tid == 0) s_choice = -1;
    __syncthreads();
    unsigned long long before = 0, kept = 0;
    for (int w = 0; w < W; ++w) {
        if (w < warp) before += s_warp[w];
        kept += s_warp[w];
    }
    unsigned long long target = (unsigned long long)((double)u * (double)kept);
    if (target >= kept) target = kept - 1;
    if (mine && before <= target && target < before + mine) {
        unsigned long long acc = before;
        for (int base = lo; base < hi; base += 32) {
            const int i = base + lane;
            unsigned long long m = 0;
            if (i < hi) {
                const float w = expf((x[i] - best) * inv_t);
                if (__float_as_uint(w) >= cut && w >= min_p) m = (unsigned long long)(w * FIXED);
            }
            unsigned long long incl = m;
            for (int off = 1; off < 32; off *= 2) {
                const unsigned long long o = __shfl_up_sync(0xffffffff, incl, off);
                if (lane >= off) incl += o;
            }
            const unsigned int past = __ballot_sync(0xffffffff, acc + incl > target);
            if (past) {
                if (lane == 0) s_choice = base + __ffs(past) - 1;
                break;
            }
            acc += __shfl_sync(0xffffffff, incl, 31);
        }
    }
    __syncthreads();
    if (tid == 0) out[row] = s_choice >= 0 ? s_choice : arg;
"""


@lru_cache(maxsize=1)
def _kernel():
    return mx.fast.cuda_kernel(
        name="sample_draw", input_names=["logits", "params"], output_names=["out"], source=_SOURCE
    )


def applies(rows: list[SamplingRow], vocab: int) -> bool:
    """The kernel chooses for the whole batch unless a drawing row sets top_k (kept by the MLX operations)."""
    return all(
        r.params.temperature < GREEDY_TEMPERATURE or r.params.top_k is None or r.params.top_k >= vocab
        for r in rows
    )


def row_params(rows: list[SamplingRow], uniforms: np.ndarray) -> np.ndarray:
    """(B, 4) float32 per row: inverse temperature (0: greedy), top_p, min_p, the row's uniform."""
    params = np.zeros((len(rows), 4), dtype=np.float32)
    for i, row in enumerate(rows):
        p = row.params
        if p.temperature >= GREEDY_TEMPERATURE:
            params[i] = (1.0 / p.temperature, p.top_p, p.min_p, uniforms[i])
    return params


def choose(logits: mx.array, params: np.ndarray) -> mx.array:
    """(B,) int32 tokens of (B, vocab) float32 `logits` (edited already); `params` from `row_params`."""
    rows = logits.shape[0]
    return _kernel()(
        inputs=[logits, mx.array(params)],
        template=[("THREADS", THREADS)],
        grid=(rows * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(rows,)],
        output_dtypes=[mx.int32],
    )[0]


def mirror(logits: np.ndarray, params: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic in NumPy (float32 weights, the same fixed-point masses and cut-off): what
    the tests compare with the MLX operations on any device."""
    out = np.empty(len(logits), dtype=np.int32)
    for b, (x, (inv_t, top_p, min_p, u)) in enumerate(zip(logits.astype(np.float32), params)):
        best = int(np.argmax(x))
        if inv_t == 0:
            out[b] = best
            continue
        w = np.exp((x - x[best]) * np.float32(inv_t)).astype(np.float32)
        mass = (w * np.float32(_FIXED)).astype(np.uint64)
        keep = w >= np.float32(min_p)
        if top_p < 1:
            # The cut-off: the smallest weight c with mass(w > c) < p <= mass(w >= c).
            bits = w.view(np.uint32)
            p = max(1, int(float(top_p) * int(mass.sum())))
            values, inverse = np.unique(bits[mass > 0], return_inverse=True)
            per_value = np.zeros(len(values), dtype=np.uint64)
            np.add.at(per_value, inverse, mass[mass > 0])
            at_least = np.cumsum(per_value[::-1])  # mass(w >= value), values descending
            keep &= bits >= values[::-1][int(np.argmax(at_least >= p))]
        kept = np.where(keep, mass, 0)
        total_kept = int(kept.sum())
        target = min(int(float(u) * total_kept), total_kept - 1)
        out[b] = int(np.argmax(np.cumsum(kept) > target))
    return out


def for_device() -> Draw | None:
    """The kernel on MLX's CUDA backend, once `check` found it chooses what the MLX operations choose;
    None elsewhere, or where the check fails (logged)."""
    if mx.default_device() != mx.gpu or not mx.cuda.is_available():
        return None
    refusal = check(choose)
    if refusal:
        logger.warning("sampling kernel not used: %s", refusal)
        return None
    logger.info("sampling kernel: mixed batches choose their tokens in one kernel")
    return choose


def check(kernel: Draw) -> str | None:
    """None where `kernel(logits, params)` chooses exactly what the MLX operations choose on a probe batch
    (greedy rows, ties, temperature alone, top_p, min_p, both, a masked row); else why not."""
    rng = np.random.default_rng(0)
    vocab = 5000  # not a multiple of the block or of the draw's blocks of 128
    settings = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=0.7, min_p=0.05),
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.02),
        SamplingParams(temperature=0.05, top_p=0.99),
    ]
    rows = [SamplingRow(settings[i % len(settings)], [1], []) for i in range(28)]
    logits = (rng.standard_normal((len(rows), vocab)) * rng.choice([0.5, 2.0, 6.0], (len(rows), 1))).astype(
        np.float32
    )
    logits[0, [7, 4000]] = logits[0].max() + 1.0  # a greedy tie: the lower id wins
    logits[3, 100:] = -np.inf  # a row a grammar narrowed to 100 tokens
    for trial in range(4):
        uniforms = rng.random(len(rows)).astype(np.float32)
        params = row_params(rows, uniforms)
        mine = np.asarray(kernel(mx.array(logits), params))
        theirs = np.asarray(choose_tokens(mx.array(logits), rows, uniforms))
        if not np.array_equal(mine, theirs):
            bad = np.flatnonzero(mine != theirs).tolist()
            return f"rows {bad} of probe {trial} chose other tokens than the MLX operations"
    return None
