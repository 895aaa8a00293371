"""How K/V are encoded in the paged pools when `kv_cache_dtype` is int8 or int4: MLX's affine quantization
(`mx.quantize`, the scheme of mlx-lm's QuantizedKVCache) over each token's head_dim vector, in groups of
64 (32 where head_dim is not a multiple of 64).

Owns the encoding only: what arrays a quantized pool keeps, their widths, encode and decode. Where they
lie is engine/runner/kv_storage.py's; which rows a forward writes and reads is engine/runner/paged_attention.py's.

One token of one head, head_dim D, group g, model dtype T:

    data    (D * bits / 32,) uint32   D codes of `bits` bits, packed
    scales  (D / g,) T                per group: x ~ code * scale + bias
    biases  (D / g,) T
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import mlx.core as mx

KVCacheDtype = Literal["auto", "int8", "int4"]
BITS: dict[str, int] = {"int8": 8, "int4": 4}
# mx.quantize's smallest group; a head_dim that is no multiple of it cannot be quantized.
_MIN_GROUP = 32


def group_size(dim: int) -> int:
    return 64 if dim % 64 == 0 else _MIN_GROUP


@dataclass(frozen=True)
class KVQuant:
    """The encoding of one quantized storage: `bits` per code, scales and biases in `dtype`."""

    bits: int
    dtype: mx.Dtype  # the model's: of scales, biases and of what `decode` returns

    @staticmethod
    def for_setting(kv_cache_dtype: str, dtype: mx.Dtype, dims: list[int]) -> KVQuant | None:
        """None for "auto" (the pools keep the model's dtype); raises where a head dim cannot be
        quantized, saying what to change."""
        if kv_cache_dtype == "auto":
            return None
        bad = sorted({d for d in dims if d % _MIN_GROUP})
        if bad:
            raise ValueError(
                f"kv_cache_dtype {kv_cache_dtype} needs K/V head dims that are multiples of {_MIN_GROUP}; "
                f"this model has {bad}: set kv_cache_dtype to auto"
            )
        return KVQuant(BITS[kv_cache_dtype], dtype)

    def widths(self, dim: int) -> tuple[int, int, int]:
        """The last-axis widths of data, scales and biases for head dim `dim` (0 for an empty V)."""
        groups = dim // group_size(dim)
        return dim * self.bits // 32, groups, groups

    def part_dtypes(self) -> tuple[mx.Dtype, mx.Dtype, mx.Dtype]:
        return mx.uint32, self.dtype, self.dtype

    def bytes_per_vector(self, dim: int) -> int:
        data, scales, biases = self.widths(dim)
        return data * 4 + (scales + biases) * self.dtype.size

    def encode(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(..., D) -> (data, scales, biases), each (..., width)."""
        data, scales, biases = mx.quantize(x.astype(self.dtype), group_size(x.shape[-1]), self.bits)
        return data, scales, biases

    def decode(self, data: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
        """The inverse of `encode`, up to rounding: (..., width) x 3 -> (..., D) in the model dtype."""
        dim = data.shape[-1] * 32 // self.bits
        out = mx.dequantize(data, scales, biases, group_size(dim), self.bits)
        return out.astype(self.dtype)
