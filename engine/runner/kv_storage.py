"""The paged KV storage: one K and one V pool per layer on the MLX device, shaped
(kv_heads, num_blocks, block_size, head_dim), so a block of one head is one contiguous row.

Owns the tensors only; which blocks a request gets is the scheduler's KV manager's choice, and how a
forward reads and writes them is engine/runner/paged_attention.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class LayerShape:
    num_kv_heads: int
    k_head_dim: int
    v_head_dim: int


class KVStorage:
    def __init__(self, shapes: list[LayerShape], num_blocks: int, block_size: int, dtype: mx.Dtype):
        self.shapes = shapes
        self.dtype = dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        # One block past the pool's: padding rows of a bucketed decode write there (engine/runner/cuda/decode_graph.py).
        self.scratch_block = num_blocks
        total = num_blocks + 1
        self.keys = [mx.zeros((s.num_kv_heads, total, block_size, s.k_head_dim), dtype) for s in shapes]
        self.values = [mx.zeros((s.num_kv_heads, total, block_size, s.v_head_dim), dtype) for s in shapes]
        mx.eval(self.keys, self.values)

    @staticmethod
    def bytes_per_block(shapes: list[LayerShape], block_size: int, dtype: mx.Dtype) -> int:
        per_token = sum(s.num_kv_heads * (s.k_head_dim + s.v_head_dim) for s in shapes)
        return per_token * block_size * dtype.size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def arrays(self) -> list[mx.array]:
        return self.keys + self.values
