"""Per-user cache locations for built artefacts (patched BLAS, converted default model, test models),
and how a folder of them is built once: under a lock, into a temporary folder renamed into place."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
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


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(folder)` if no complete build exists. The build writes a private
    temporary folder renamed into place, so `target` either does not exist or is complete; the lock
    makes concurrent first starts build only once."""
    if target.is_dir():
        return target
    with build_lock(target):
        if target.is_dir():  # another process built it while we waited
            return target
        for stale in target.parent.glob(f".{target.name}.tmp*"):  # left by a crashed build
            shutil.rmtree(stale, ignore_errors=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp", dir=target.parent))
        try:
            build(tmp_dir)
            os.chmod(tmp_dir, 0o755)  # mkdtemp makes it 0700; keep the usual directory mode
            tmp_dir.rename(target)
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
    return target
