"""Per-user cache locations for built artefacts (patched BLAS, converted default model), and the lock
that makes concurrent first starts build each of them once."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from platformdirs import user_cache_dir

_ENV_CACHE = "MLX_RAY_SERVE_CACHE"


def cache_dir() -> Path:
    path = Path(os.environ.get(_ENV_CACHE) or user_cache_dir("mlx-ray-serve"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(f".{target.name}.lock")
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes, even if we crash
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
