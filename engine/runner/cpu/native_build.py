"""Native code of the CPU paths built with the system C compiler into the per-user cache, once per key.

Owns the compiler's lookup and the cached build; what a library is built from and keyed by is its
caller's (engine/runner/cpu/cpu_decode.py, engine/runner/cpu/onednn.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from engine.platform.paths import cache_dir

logger = logging.getLogger(__name__)

_ENV_CC = "CC"


def compiler() -> str | None:
    """The C compiler: $CC, else cc or gcc on the PATH; None where there is none."""
    return os.environ.get(_ENV_CC) or shutil.which("cc") or shutil.which("gcc")


def compiled(name: str, key: str, head: list[str], tail: list[str], fallback: str) -> Path | None:
    """The library `name`-`key`.so in the cache, built first where it is not there by the command
    `head` -o <file> `tail` (compiler, flags and sources; then libraries); None where the build failed,
    logged with `fallback` (what runs instead)."""
    target = cache_dir() / "kernels" / f"{name}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:
        subprocess.run([*head, "-o", str(tmp), *tail], check=True, capture_output=True)
        tmp.replace(target)  # atomic: a concurrent build of the same key writes the same bytes
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        logger.warning("%s not built, %s: %s %s", name, fallback, exc, detail.decode()[-500:])
        tmp.unlink(missing_ok=True)
        return None
    return target
