"""Sets MLX's CUDA graph cache so a server that runs for days never aborts on it.

Owns only two environment variables, read by MLX when a GPU stream's command encoder is made (the
first GPU operation), so they are set on import of `engine`, before any MLX work; a value the user
set is kept. Never touches MLX otherwise.

Why: MLX 0.32 caches an instantiated CUDA graph per topology of each command buffer in an LRU of
`MLX_CUDA_GRAPH_CACHE_SIZE` entries (400 by default) and raises "Cache thrashing is happening" once
that cache has missed more than twice its size over the process's lifetime
(mlx/backend/cuda/lru_cache.h). A long-running server sees new topologies now and then (a new batch
mix, a prefill chunk beside decode rows), so lifetime misses only grow, and after enough of them
every request would fail. With the check off a miss costs one graph instantiation (a few ms) and the
LRU still bounds the memory; the larger cache keeps the engine's bucketed topologies resident.
"""

from __future__ import annotations

import os

GRAPH_CACHE_SIZE = 2048
DEFAULTS = {"MLX_ENABLE_CACHE_THRASHING_CHECK": "0", "MLX_CUDA_GRAPH_CACHE_SIZE": str(GRAPH_CACHE_SIZE)}


def bound_graph_cache() -> dict[str, str]:
    """Sets each default the environment lacks; returns the values in force."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in DEFAULTS}
