"""Softmax, SwiGLU and multi-token attention built from fused multiply-adds, for MLX's CPU backend.

MLX's CPU `exp` (and `sigmoid`, built on it) runs as scalar code: 12 ns per element on this
machine's cores, against 0.3 ns for a fused chain of multiplies and adds. A 251-token prefill of
SmolLM2-135M spends about a third of its time there (attention softmax and the MLP's SiLU). Here
exp(x) for x <= 0 is 2^k * p(r) with k = round(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2] and p a
degree-7 Taylor polynomial (relative error under 2e-7, below MLX's own exp's 4e-6).

The arithmetic runs as `mx.compile(shapeless=True)` kernels, which MLX generates as C++ loops built
with plain `-O3`, and splits into several kernels (at most 24 arrays each, scalar constants
included). A loop vectorizes only while it holds adds, multiplies, divides, compares and
float/int32 casts: `floor`, a shift of int64 and a `where` among divides leave it scalar (measured
on 200 x 1536 elements: 2 to 14 times slower). SwiGLU's sigmoid is built from those alone: k
rounded with the 1.5 * 2^23 trick, 2^k as the float bits (k + 127) << 23 (a multiply and a cast)
that `view` reinterprets between two kernels, and no `where`: 1.3 ms against 3.5 ms for the first
form at 200 x 1536, relative error under 3e-7. Softmax keeps the first form (`_exp_nonpositive`:
2^k from an int64 shift, 0 below -43); rebuilt the same way it was slower, its cost being the
number of kernels MLX splits it into.

Owns only this arithmetic; engine/runner/attention_hook.py, engine/runner/cpu/window_attention.py and
engine/runner/cpu/activation_hook.py decide where it runs (the CPU device only: GPUs have fast exp).
"""

from __future__ import annotations

import mlx.core as mx

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split so that k * _LN2_HI is exact in float32
_LN2_LO = 1.428606765330187e-06
_FLUSH = -43.0  # exp(-43) < 2^-62: below it the result is 0
_ONE = mx.array(1, dtype=mx.int64)
_ROUND = 12582912.0  # 1.5 * 2^23: (y + _ROUND) - _ROUND is y rounded to the nearest integer (|y| < 2^22)
_SIGMOID_FLUSH = -88.0  # rounds to k = -127, whose 2^k bits are 0
_QUERY_BLOCK = 64  # causal attention's query rows per block (see `attention`)


def _exp_nonpositive(x: mx.array) -> mx.array:
    """exp(x) for x <= 0, in float32."""
    clamped = mx.maximum(x, _FLUSH)
    k = (clamped * _LOG2E - 0.5).astype(mx.int32)  # truncation toward 0: ceil(y - 0.5) = round(y)
    kf = k.astype(mx.float32)
    r = clamped - kf * _LN2_HI - kf * _LN2_LO
    p = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (1 / 720 + r / 5040))))))
    two_to_k = 1.0 / mx.left_shift(_ONE, (-k).astype(mx.int64)).astype(mx.float32)
    return mx.where(x < _FLUSH, 0.0, p * two_to_k)


def _sigmoid_reduce(gate: mx.array) -> tuple[mx.array, mx.array]:
    """For e = exp(-|gate|) = 2^k * exp(r): r, and the int32 bits of the float 2^k."""
    y = mx.maximum(-mx.abs(gate.astype(mx.float32)), _SIGMOID_FLUSH)
    kf = (y * _LOG2E + _ROUND) - _ROUND
    r = (y - kf * _LN2_HI) - kf * _LN2_LO
    return r, ((kf + 127.0) * 8388608.0).astype(mx.int32)


def _swiglu_from(gate: mx.array, x: mx.array, r: mx.array, two_to_k: mx.array) -> mx.array:
    """silu(g) * x, without a branch: with e = exp(-|g|) <= 1, below = sigmoid(-|g|) = e / (1 + e)
    and sigmoid(g) = below + h (1 - 2 below), h = 1 for g > 0 and 0 otherwise."""
    g = gate.astype(mx.float32)
    r2 = r * r
    e = (
        (1.0 + r) + r2 * ((1 / 2 + r / 6) + r2 * ((1 / 24 + r / 120) + r2 * (1 / 720 + r / 5040)))
    ) * two_to_k
    below = e / (1.0 + e)
    h = (g > 0).astype(mx.float32)
    return (g * (below + h * (1.0 - 2.0 * below))).astype(gate.dtype) * x


# Compiled shapeless, these must stay elementwise over inputs of one shape: a reduction or a
# broadcast inside a shapeless kernel breaks when a later call's shape has 1s where the first had not.
_exp_kernel = mx.compile(_exp_nonpositive, shapeless=True)
_sigmoid_reduce_kernel = mx.compile(_sigmoid_reduce, shapeless=True)
_swiglu_kernel = mx.compile(_swiglu_from, shapeless=True)


def softmax(scores: mx.array) -> mx.array:
    """Over the last axis, like mx.softmax(precise=True)."""
    shifted = scores.astype(mx.float32) - mx.max(scores, axis=-1, keepdims=True)
    e = _exp_kernel(shifted)
    # A running sum adds left to right, so masked (exactly 0) terms anywhere in a row leave it
    # bit-identical: a row's result does not depend on how wide its batch padded the scores
    # (mx.sum's vector lanes group the terms by position, and would).
    total = mx.cumsum(e, axis=-1)[..., -1:]
    return (e / total).astype(scores.dtype)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x."""
    if gate.shape != x.shape:
        gate, x = mx.broadcast_arrays(gate, x)
    r, bits = _sigmoid_reduce_kernel(gate)
    return _swiglu_kernel(gate, x, r, bits.view(mx.float32))


def attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    """Attention of L queries over S keys, as mlx-lm calls it: queries (B, Hq, L, D), keys and values
    (B, Hkv, S, D) with Hq a multiple of Hkv; `mask` "causal" (query i sees keys up to S - L + i), a
    boolean or additive array broadcastable to (B, Hq, L, S), or None. Returns (B, Hq, L, Dv)."""
    length = queries.shape[2]
    if isinstance(mask, str) and length > _QUERY_BLOCK:
        # Causal: query block [a, b) sees keys up to S - L + b only, so the scores right of that
        # (masked anyway) are never computed: 56% of the work for a fresh 512-token prompt.
        offset = keys.shape[2] - length
        blocks = [
            _attention(
                queries[:, :, a : a + _QUERY_BLOCK],
                keys[:, :, : offset + a + _QUERY_BLOCK],
                values[:, :, : offset + a + _QUERY_BLOCK],
                scale,
                mask,
            )
            for a in range(0, length, _QUERY_BLOCK)
        ]
        return mx.concatenate(blocks, axis=2)
    return _attention(queries, keys, values, scale, mask)


def _attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    batch, num_q, length, dim = queries.shape
    num_kv, num_keys = keys.shape[1], keys.shape[2]
    group = num_q // num_kv
    q = (queries * scale).reshape(batch, num_kv, group * length, dim)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(batch, num_kv, group, length, num_keys)
    if isinstance(mask, str):
        assert mask == "causal", f"unknown mask {mask!r}"
        visible = mx.arange(num_keys)[None, :] <= mx.arange(num_keys - length, num_keys)[:, None]
        scores = mx.where(visible, scores, mx.array(-mx.inf, scores.dtype))
    elif mask is not None:
        mask = _grouped(mask, num_kv, group)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.array(-mx.inf, scores.dtype))
        else:
            scores = scores + mask
    probs = softmax(scores).reshape(batch, num_kv, group * length, num_keys)
    return (probs @ values).reshape(batch, num_q, length, -1)


def _grouped(mask: mx.array, num_kv: int, group: int) -> mx.array:
    """A (.., heads or 1, L, S) mask as (.., num_kv or 1, group or 1, L, S), matching the scores."""
    while mask.ndim < 4:
        mask = mask[None]
    heads = mask.shape[1]
    if heads == 1:
        return mask[:, :, None]
    return mask.reshape(mask.shape[0], num_kv, group, *mask.shape[2:])
