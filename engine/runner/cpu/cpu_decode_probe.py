"""The load-time check of the C decode forward (engine/runner/cpu/cpu_decode.py): before it serves a model,
it decodes a short sequence and must give MLX's logits. Built for int8/int4 pools it must also quantize
bit for bit as mx.quantize does, and give the logits of MLX's gather path over the same quantized pools.

Owns only the check. It runs the kernel and MLX on small pools of its own, never on the engine's.
"""

from __future__ import annotations

import logging
from typing import Protocol

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

    @staticmethod
    def pool_arrays(storage: KVStorage) -> list[mx.array]: ...

    def quantize(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


logger = logging.getLogger(__name__)

_TOKENS = [1, 2, 3, 4, 5, 6]
# Logits of the C forward and of MLX's differ by summation order only; the probe allows this much
# (relative to the largest logit). Measured on SmolLM2-135M over float32 pools: 4e-5 (3e-6 at the first
# position with AVX-512 tiles), under _TOLERANCE.
_TOLERANCE = 1e-3
# Over quantized pools an element within float noise of a rounding boundary may take the neighbouring
# code in one path only, and every later position attends to it. Without such a flip the difference is
# that of float32 pools (1.4e-5 to 4.3e-5 at the first decode position, int8 and int4). With one (int8,
# the AVX-512 build, from position 5) it was 1.9e-3; a kernel that computed the wrong K/V would miss by
# far more, and the quantizer itself is checked bit for bit.
_QUANTIZED_TOLERANCE = 5e-3
_PREFILL = 2  # tokens MLX prefills before the decode steps, as the engine's prefill would


def probe_refusal(decode: CpuDecode, model: nn.Module, storage: KVStorage) -> str | None:
    """None where the kernel matches MLX on the probe; else why it must not serve."""
    if storage.quant is None:
        return (
            None
            if _float_matches(decode, model, storage)
            else "its logits differ from MLX's on the load probe"
        )
    kv = storage.kv_cache_dtype
    if not _quantizer_matches(decode, storage):
        return f"its {kv} codes, scales or biases differ from mx.quantize's on the load probe"
    if not _quantized_matches(decode, model, storage):
        return f"its logits differ from MLX's gather path over {kv} pools on the load probe"
    return None


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
        logits = decode(
            np.array([token, token], np.int32), np.array([pos, pos], np.int32), tables, pools, num_blocks
        )
        if not _close(logits, reference[pos], _TOLERANCE, pos):
            return False
    return True


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


def _quantized_matches(decode: CpuDecode, model: nn.Module, storage: KVStorage) -> bool:
    """MLX prefills the probe's first tokens into quantized pools of its own; the kernel gets a copy of
    them for two rows (one a block further on) and decodes the rest, one token a step, beside MLX's
    gather path decoding the same tokens over its own pools; each step's logits must agree."""
    block_size = storage.block_size
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
        if not _close(logits, mlx_step(pos, pos + 1), _QUANTIZED_TOLERANCE, pos):
            return False
    return True
