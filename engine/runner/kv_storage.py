"""The paged KV storage: per layer one K and one V pool on the MLX device, shaped
(kv_heads, num_blocks + 1, block_size, head_dim), so a block of one head is one contiguous row. With a
quantized `kv_cache_dtype` (engine/runner/kv_quant.py) each pool is packed codes (uint32) with per-group
scales and biases beside it, all three with the same leading axes, so a row index means the same token
in each.

Owns the tensors only; which blocks a request gets is the scheduler's KV manager's choice, and how a
forward reads and writes them is engine/runner/paged_attention.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.runner.kv_quant import KVQuant, group_size

import mlx.core as mx

Side = Literal["keys", "values"]


@dataclass(frozen=True)
class LayerShape:
    num_kv_heads: int
    k_head_dim: int
    v_head_dim: int


class KVStorage:
    def __init__(
        self,
        shapes: list[LayerShape],
        num_blocks: int,
        block_size: int,
        dtype: mx.Dtype,
        kv_cache_dtype: str = "auto",
    ):
        self.shapes = shapes
        self.dtype = dtype  # the model's: what attention reads, whatever the pools keep
        self.kv_cache_dtype = kv_cache_dtype
        self.quant = KVQuant.for_setting(kv_cache_dtype, dtype, _dims(shapes))
        self.num_blocks = num_blocks
        self.block_size = block_size
        # One block past the pool's: padding rows of a bucketed decode write there (engine/runner/cuda/decode_graph.py).
        self.scratch_block = num_blocks
        self.keys, self.key_scales, self.key_biases = self._side([s.k_head_dim for s in shapes])
        self.values, self.value_scales, self.value_biases = self._side([s.v_head_dim for s in shapes])
        mx.eval(self.arrays())

    def _side(self, dims: list[int]) -> tuple[list[mx.array], list[mx.array], list[mx.array]]:
        """Per layer: the data pools, and (quantized only, else empty) the scales and biases pools."""
        total = self.num_blocks + 1
        lead = [(s.num_kv_heads, total, self.block_size) for s in self.shapes]
        if self.quant is None:
            return [mx.zeros((*L, d), self.dtype) for L, d in zip(lead, dims)], [], []
        parts: list[list[mx.array]] = [[], [], []]
        for L, d in zip(lead, dims):
            for part, width, dtype in zip(parts, self.quant.widths(d), self.quant.part_dtypes()):
                part.append(mx.zeros((*L, width), dtype))
        return parts[0], parts[1], parts[2]

    def side(self, name: Side) -> list[list[mx.array]]:
        """The per-layer lists that hold one side's state: [data], or [data, scales, biases] when
        quantized. A write replaces entry `layer` of each list with the written array."""
        if name == "keys":
            return [self.keys, self.key_scales, self.key_biases] if self.quant else [self.keys]
        return [self.values, self.value_scales, self.value_biases] if self.quant else [self.values]

    @staticmethod
    def bytes_per_block(
        shapes: list[LayerShape], block_size: int, dtype: mx.Dtype, kv_cache_dtype: str = "auto"
    ) -> int:
        """Every array's bytes for one block: the data, and the scales and biases where quantized."""
        quant = KVQuant.for_setting(kv_cache_dtype, dtype, _dims(shapes))
        per_token = 0
        for s in shapes:
            for dim in (s.k_head_dim, s.v_head_dim):
                per_token += s.num_kv_heads * (quant.bytes_per_vector(dim) if quant else dim * dtype.size)
        return per_token * block_size

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block(self.shapes, 1, self.dtype, self.kv_cache_dtype)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    def arrays(self) -> list[mx.array]:
        """Every array that holds KV state, each with the block axis at axis 1: (heads, num_blocks + 1,
        block_size, X), so a block's whole data is `[a[:, ids] for a in storage.arrays()]`. Keys then
        values per layer first (engine/runner/cuda/decode_graph.py splits them so), then the scales and
        biases of a quantized storage."""
        extras = self.key_scales + self.key_biases + self.value_scales + self.value_biases
        return self.keys + self.values + extras

    @property
    def identity(self) -> str:
        """What makes stored blocks interchangeable between two storages (a block copied out of one may
        be copied into the other): the model dtype, the KV encoding, the block size, the layer shapes."""
        dtype = str(self.dtype).removeprefix("mlx.core.")
        encoding = self.kv_cache_dtype
        if self.quant is not None:
            groups = sorted({group_size(d) for d in _dims(self.shapes) if d})
            encoding += f" group {'/'.join(map(str, groups))}"
        return f"{dtype} kv {encoding} block {self.block_size} layers {_layers_summary(self.shapes)}"


def _dims(shapes: list[LayerShape]) -> list[int]:
    return [d for s in shapes for d in (s.k_head_dim, s.v_head_dim)]


def _layers_summary(shapes: list[LayerShape]) -> str:
    """Runs of equal layers, e.g. "3x64x64*30" (kv heads x K dim x V dim, times the layers in the run)."""
    runs: list[list] = []
    for s in shapes:
        key = f"{s.num_kv_heads}x{s.k_head_dim}x{s.v_head_dim}"
        if runs and runs[-1][0] == key:
            runs[-1][1] += 1
        else:
            runs.append([key, 1])
    return ",".join(f"{key}*{count}" for key, count in runs) or "none"
