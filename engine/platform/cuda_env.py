"""Sets MLX's CUDA backend up for a server that runs for days on varied requests.

Owns only three environment variables, read by MLX when a GPU stream's command encoder is made (the
first GPU operation), so they are set on import of `engine`, before any MLX work; a value the user
set is kept. Never touches MLX otherwise.

- `MLX_ENABLE_CACHE_THRASHING_CHECK=0`, `MLX_CUDA_GRAPH_CACHE_SIZE=2048`: MLX 0.32 caches an
  instantiated CUDA graph per topology of each command buffer in an LRU (400 entries by default) and
  raises "Cache thrashing is happening" once that cache has missed more than twice its size over the
  process's lifetime (mlx/backend/cuda/lru_cache.h). A long-running server sees new topologies now and
  then (a new batch mix, a prefill chunk beside decode rows), so lifetime misses only grow, and after
  enough of them every request would fail. With the check off a miss costs one graph instantiation
  (a few ms) and the LRU still bounds the memory; the larger cache keeps the engine's topologies resident.
- `MLX_CUDA_USE_CUDNN_SDPA=0`: cuDNN's attention builds a graph for every new (query, key) length
  pair, tens of ms each, and a server's prefill chunks rarely repeat a length. On an H200 with
  prompts of 16-1,500 tokens (bench/stress.py) a decode step carrying one prefill chunk took 68.5 ms
  (median) with it and 22.6 ms without, and output tokens/s rose 1.58x (docs/benchmarks.md).
"""

from __future__ import annotations

import os

GRAPH_CACHE_SIZE = 2048
DEFAULTS = {
    "MLX_ENABLE_CACHE_THRASHING_CHECK": "0",
    "MLX_CUDA_GRAPH_CACHE_SIZE": str(GRAPH_CACHE_SIZE),
    "MLX_CUDA_USE_CUDNN_SDPA": "0",
}


def set_cuda_defaults() -> dict[str, str]:
    """Sets each default the environment lacks; returns the values in force."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in DEFAULTS}
