"""Per-user cache locations for built artefacts (patched BLAS, converted default model)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir

_ENV_CACHE = "MLX_RAY_SERVE_CACHE"


def cache_dir() -> Path:
    path = Path(os.environ.get(_ENV_CACHE) or user_cache_dir("mlx-ray-serve"))
    path.mkdir(parents=True, exist_ok=True)
    return path
