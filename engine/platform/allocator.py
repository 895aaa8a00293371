"""Keeps glibc's malloc from handing MLX's large CPU buffers back to the kernel after every op.

Owns only this process's malloc tunables (mallopt); never allocates or frees anything itself.

MLX's CPU allocator is plain malloc/free with no buffer cache. glibc serves blocks above its mmap
threshold with a fresh mmap and trims freed heap tops, so every prefill activation (3 MB for a
512x1536 MLP row block, 9 MB for 512x512 attention scores) is page-faulted and zeroed again on each
op; in this VM that cost more than the arithmetic (a compiled exp over 2 M floats: 16 ns/element
against 3 with the heap kept). Raising the mmap threshold to glibc's maximum and never trimming below
`_KEEP_BYTES` keeps those pages mapped for reuse; the cost is that RSS stays at its high-water mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_ENV_DISABLE = "MLX_RAY_SERVE_MALLOC"  # set to "default" to leave glibc's tunables as they are
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling on 64-bit: larger values are refused
_KEEP_BYTES = 1 << 30  # free heap top glibc keeps instead of trimming
_TOP_PAD_BYTES = 64 << 20  # heap growth per brk, so a step's peak is reached in a few calls


@dataclass(frozen=True)
class AllocatorState:
    tuned: bool
    reason: str


_state: AllocatorState | None = None


def keep_heap() -> AllocatorState:
    """Sets the tunables once per process; a no-op (with the reason) off glibc."""
    global _state
    if _state is None:
        _state = _tune()
    return _state


def _tune() -> AllocatorState:
    if not sys.platform.startswith("linux"):
        return AllocatorState(False, "not Linux: the platform's allocator is left alone")
    if os.environ.get(_ENV_DISABLE) == "default":
        return AllocatorState(False, f"{_ENV_DISABLE}=default")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:  # musl and others have no mallopt
        return AllocatorState(False, f"no glibc mallopt: {exc}")
    settings = {
        _M_MMAP_THRESHOLD: _MMAP_THRESHOLD_BYTES,
        _M_TRIM_THRESHOLD: _KEEP_BYTES,
        _M_TOP_PAD: _TOP_PAD_BYTES,
    }
    refused = [param for param, value in settings.items() if mallopt(param, value) != 1]
    if refused:
        logger.warning("mallopt refused parameters %s; large MLX buffers may be re-faulted", refused)
        return AllocatorState(False, f"mallopt refused {refused}")
    return AllocatorState(
        True,
        f"mmap threshold {_MMAP_THRESHOLD_BYTES >> 20} MiB, trim threshold {_KEEP_BYTES >> 20} MiB, "
        f"top pad {_TOP_PAD_BYTES >> 20} MiB",
    )
