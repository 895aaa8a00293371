"""How many KV blocks the memory budget holds and the longest sequence they allow, checked at load.

Owns the budget arithmetic only: what a block costs is engine/runner/kv_storage.py's, what a request
gets is the scheduler's.
"""

from __future__ import annotations

import os

from engine.config import EngineConfig
from engine.runner.kv_storage import KVStorage

import mlx.core as mx


def total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# A model with no attention layer keeps no KV: its blocks only count tokens, up to this many per sequence
# where neither the config nor the model sets a context length.
_STATE_ONLY_CONTEXT_LEN = 32768


def num_blocks(
    config: EngineConfig,
    shapes,
    dtype: mx.Dtype,
    state_bytes: int = 0,
    context_len: int | None = None,
    draft_bytes_per_block: int = 0,
) -> int:
    """KV blocks that fit the budget once the state slots (`state_bytes`) are taken out of it; a draft
    model's pools take `draft_bytes_per_block` of each block's share."""
    budget = config.kv_cache_memory_bytes or int(config.kv_cache_memory_fraction * total_memory_bytes())
    if state_bytes >= budget:
        raise ValueError(
            f"the KV budget of {budget} bytes cannot hold the recurrent state of max_num_seqs "
            f"{config.max_num_seqs} requests ({state_bytes} bytes); raise kv_cache_memory_bytes or "
            "lower max_num_seqs"
        )
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if not shapes:
        max_len = config.max_model_len or context_len or _STATE_ONLY_CONTEXT_LEN
        return config.max_num_seqs * -(-max_len // config.block_size)
    per_block = KVStorage.bytes_per_block(shapes, config.block_size, dtype, config.kv_cache_dtype)
    per_block += draft_bytes_per_block
    num_blocks = (budget - state_bytes) // per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV budget of {budget} bytes holds no {per_block}-byte block; raise kv_cache_memory_bytes"
        )
    return num_blocks


def max_model_len(config: EngineConfig, context_len: int | None, num_blocks: int) -> int:
    capacity = num_blocks * config.block_size
    if config.max_model_len is not None:
        if context_len is not None and config.max_model_len > context_len:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's {context_len}; lower it or pick another model"
            )
        if config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the KV cache's {capacity} tokens; "
                "raise kv_cache_memory_bytes or lower max_model_len"
            )
        return config.max_model_len
    return min(context_len or capacity, capacity)
