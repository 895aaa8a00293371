"""The load-time check of the C decode forward (engine/runner/cpu/cpu_decode.py): before it serves a model,
it decodes a short sequence and must give MLX's logits. Built for int8/int4 pools it must also quantize
bit for bit as mx.quantize does, and give the logits of MLX's gather path over the same quantized pools.

Owns only the check. It runs the kernel and MLX on small pools of its own, never on the engine's.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from engine.runner.kv_storage import KVStorage
from engine.runner.paged_attention import PagedLayerCache, StepLayout

import mlx.core as mx
import numpy as np
from mlx import nn


class CpuDecode(Protocol):
    """What the probe calls of engine/runner/cpu/cpu_decode.py's CpuDecode (a protocol: that module
    imports this one)."""

    def __call__(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        tables: np.ndarray,
        pools: list[np.ndarray],
        pool_blocks: int,
    ) -> np.ndarray: ...

    screen: Any  # the head's Screen for greedy rows (cpu_greedy.h), or None

    def greedy(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        tables: np.ndarray,
        pools: list[np.ndarray],
        pool_blocks: int,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    @staticmethod
    def pool_arrays(storage: KVStorage) -> list[mx.array]: ...

    def quantize(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


logger = logging.getLogger(__name__)

_TOKENS = [1, 2, 3, 4, 5, 6]
# Logits of the C forward and of MLX's differ by summation order only; the probe allows this much
# (relative to the largest logit). Measured on SmolLM2-135M over float32 pools: 4e-5 (3e-6 at the first
# position with AVX-512 tiles), under _TOLERANCE.
_TOLERANCE = 1e-3
# Over quantized pools an element within float noise of a rounding boundary may take a neighbouring
# code in one path only (or, in the widest groups of SmolLM2-135M's outlier channels, two codes off), and
# every later position would attend to it: carried along, such a flip moved the logits by 1.9e-3 (int8,
# the AVX-512 build). So after each step both paths go on from MLX's K/V, the logits keep _TOLERANCE
# (measured that way: at most 1.6e-4 on SmolLM2-135M, int8 and int4, AVX-512 and PRESCOTT core types),
# and the K/V each step writes are checked on their own: codes at most _MAX_CODE_STEPS from MLX's, at
# most _MAX_FLIPPED of them different at all (measured: 0.6%), scales and biases equal within
# _NOISE of the group's span (measured: 9e-5). A kernel that computed the wrong K/V misses all three by
# far; the quantizer itself is checked bit for bit.
_MAX_CODE_STEPS = 2
_MAX_FLIPPED = 0.02
_NOISE = 1e-3
_PREFILL = 2  # tokens MLX prefills before the decode steps, as the engine's prefill would


def probe_refusal(decode: CpuDecode, model: nn.Module, storage: KVStorage) -> str | None:
    """None where the kernel matches MLX on the probe; else why it must not serve."""
    if storage.quant is None:
        return (
            None
            if _float_matches(decode, model, storage)
            else "its logits differ from MLX's on the load probe"
        )
    if not _quantizer_matches(decode, storage):
        return f"its {storage.kv_cache_dtype} codes, scales or biases differ from mx.quantize's on the load probe"
    return _quantized_refusal(decode, model, storage)


def _tables(block_size: int) -> tuple[int, np.ndarray]:
    """Two rows' block tables over a pool of their own: row 1 in other blocks, in reverse order."""
    num_blocks = 2 * (-(-len(_TOKENS) // block_size))
    half = num_blocks // 2
    tables = np.array([list(range(half)), list(range(half, num_blocks))[::-1]], dtype=np.int32)
    return num_blocks, tables


def _close(logits: np.ndarray, reference: np.ndarray, tolerance: float, pos: int) -> bool:
    scale = max(1.0, float(np.abs(reference).max()))
    worst = float(np.abs(logits - reference[None]).max()) / scale
    if worst > tolerance:
        logger.warning(
            "C decode kernel's logits differ from MLX's at position %d by %.2g: not used", pos, worst
        )
        return False
    return True


def _float_matches(decode: CpuDecode, model: nn.Module, storage: KVStorage) -> bool:
    """Decodes the probe token by token, two rows at once (one of them a block further on), and
    compares every step's logits with MLX's forward over the whole sequence."""
    from mlx_lm.models.cache import KVCache

    shape, block_size = storage.shapes[0], storage.block_size
    num_blocks, tables = _tables(block_size)
    pools = [
        np.zeros((shape.num_kv_heads, num_blocks, block_size, shape.k_head_dim), np.float32)
        for _ in range(2 * len(storage.shapes))
    ]
    expected = model(mx.array([_TOKENS]), cache=[KVCache() for _ in model.model.layers])[0]
    mx.eval(expected)
    reference = np.asarray(expected)
    for pos, token in enumerate(_TOKENS):
        inputs = (
            np.array([token, token], np.int32),
            np.array([pos, pos], np.int32),
            tables,
            pools,
            num_blocks,
        )
        logits = decode(*inputs)
        if not _close(logits, reference[pos], _TOLERANCE, pos):
            return False
        if decode.screen is not None and not _greedy_matches(decode, inputs, logits):
            decode.screen = None  # the full head serves greedy rows too
    return True


def _greedy_matches(decode: CpuDecode, inputs: tuple, logits: np.ndarray) -> bool:
    """The screened head's greedy tokens are the full logits' first argmax, and their logits the full
    head's bits (the same step again: it writes the same K/V)."""
    chosen, screened = decode.greedy(*inputs)
    rows = np.arange(len(chosen))
    if (chosen == logits.argmax(axis=1)).all() and (screened[rows, chosen] == logits[rows, chosen]).all():
        return True
    logger.warning("the C forward's screened head chose other greedy tokens than its full head: not used")
    return False


def _quantizer_matches(decode: CpuDecode, storage: KVStorage) -> bool:
    """The kernel's quantizer against mx.quantize, bit for bit, on random vectors of several magnitudes
    and the edge cases: a constant vector, zeros, and integers (halfway ties in rint)."""
    quant = storage.quant
    assert quant is not None
    dim = storage.shapes[0].k_head_dim
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((64, dim)) * rng.choice([1e-3, 1.0, 30.0], (64, 1))
    vectors[:4] = [[1.5], [0.0], [-2.0], [1e-9]]
    vectors[4:8] = rng.integers(-8, 8, (4, dim))
    vectors = vectors.astype(np.float32)
    mine = decode.quantize(vectors)
    theirs = [np.asarray(a) for a in quant.encode(mx.array(vectors))]
    if all(a.tobytes() == b.tobytes() for a, b in zip(mine, theirs)):
        return True
    logger.warning("C decode kernel quantizes K/V other than mx.quantize: not used")
    return False


def _quantized_refusal(decode: CpuDecode, model: nn.Module, storage: KVStorage) -> str | None:
    """MLX prefills the probe's first tokens into quantized pools of its own; the kernel gets a copy of
    them for two rows (one a block further on) and decodes the rest, one token a step, beside MLX's
    gather path decoding the same tokens over its own pools; each step's logits and written K/V must
    agree."""
    block_size, kv = storage.block_size, storage.kv_cache_dtype
    num_blocks, tables = _tables(block_size)
    half = num_blocks // 2
    reference = KVStorage(storage.shapes, half, block_size, storage.dtype, storage.kv_cache_dtype)

    def mlx_step(start: int, end: int) -> np.ndarray:
        layout = StepLayout([start], end - start, [list(range(-(-end // block_size)))], block_size)
        caches = [PagedLayerCache(reference, i, layout) for i in range(len(storage.shapes))]
        logits = model(mx.array([_TOKENS[start:end]]), cache=caches)[0, -1]
        mx.eval(logits, reference.arrays())
        return np.asarray(logits)

    mlx_step(0, _PREFILL)
    pools = []
    for array in decode.pool_arrays(reference):
        prefilled = np.asarray(array)
        pool = np.zeros((prefilled.shape[0], num_blocks, *prefilled.shape[2:]), prefilled.dtype)
        for j in range(half):
            pool[:, tables[0, j]] = pool[:, tables[1, j]] = prefilled[:, j]
        pools.append(pool)
    for pos in range(_PREFILL, len(_TOKENS)):
        token = _TOKENS[pos]
        logits = decode(
            np.array([token, token], np.int32), np.array([pos, pos], np.int32), tables, pools, num_blocks
        )
        if not _close(logits, mlx_step(pos, pos + 1), _TOLERANCE, pos):
            return f"its logits differ from MLX's gather path over {kv} pools on the load probe"
        theirs = [np.asarray(a) for a in decode.pool_arrays(reference)]
        for row in (0, 1):
            slot = (tables[row, pos // block_size], pos % block_size)
            if not _writes_match(reference, pools, theirs, slot, pos):
                return f"the {kv} K/V it writes differ from MLX's gather path's on the load probe"
            # Both paths go on from MLX's K/V, so a flipped code is checked once, not carried along.
            for mine, their in zip(pools, theirs):
                mine[:, slot[0], slot[1]] = their[:, pos // block_size, pos % block_size]
    return None


def _writes_match(
    reference: KVStorage,
    pools: list[np.ndarray],
    theirs_pools: list[np.ndarray],
    slot: tuple[int, int],
    pos: int,
) -> bool:
    """The K/V the kernel wrote at `slot` of its pools against what MLX's path wrote for position `pos`
    (block pos // block_size of `reference`, whose pools are `theirs_pools` in the kernel's order), by
    the bars above."""
    quant = reference.quant
    assert quant is not None
    block, offset = pos // reference.block_size, pos % reference.block_size
    flipped = total = 0
    for i in range(0, len(pools), 3):
        mine = [pools[i + j][:, slot[0], slot[1]] for j in range(3)]
        theirs = [theirs_pools[i + j][:, block, offset] for j in range(3)]
        if mine[0].shape[-1] == 0:
            continue
        a, b = _unpack(mine[0], quant.bits), _unpack(theirs[0], quant.bits)
        span = np.abs(theirs[1]) * (2**quant.bits - 1) + np.abs(theirs[2])
        noise = max(
            float((np.abs(m - t) / np.maximum(span, 1e-30)).max()) for m, t in zip(mine[1:], theirs[1:])
        )
        if noise > _NOISE or np.abs(a - b).max() > _MAX_CODE_STEPS:
            logger.warning("C decode kernel wrote K/V that differ from MLX's at position %d: not used", pos)
            return False
        flipped += int(np.count_nonzero(a != b))
        total += a.size
    if flipped > _MAX_FLIPPED * total:
        logger.warning(
            "C decode kernel wrote %d of %d K/V codes off at position %d: not used", flipped, total, pos
        )
        return False
    return True


def _unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """Packed uint32 words -> one int64 code per element (mx.quantize's order: low bits first)."""
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    return ((words[..., None] >> shifts) & np.uint32(2**bits - 1)).astype(np.int64)
