"""The C forward's weights moved onto 2 MB pages: MLX arrays re-laid in aligned arenas, and numpy copies
allocated aligned. Owns only the layout of bytes the model already holds; never changes a value.

A decode step streams every weight from memory. On 4 KB pages the CPU's prefetchers stop at each page
boundary and every page costs a TLB walk: two threads read 39.5-42.7 GB/s from 4 KB pages against
44.2-47.1 from 2 MB ones (docs/benchmarks.md, ninth pass). llama.cpp gets them for free: it maps its
GGUF file, and the page cache's large folios map most of it on 2 MB pages. MLX allocates each weight
alone, at no particular alignment, so only the whole 2 MB pages inside an array could be collapsed (about
30% of the bytes). Here each group of weights is copied into one arena aligned to 2 MB and the model's
arrays become views of it, so the weights are held once, then the arena is collapsed with MADV_COLLAPSE.
Linux only; anywhere it fails the weights stay where they are, on whatever pages they have.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

logger = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20
# Weights are copied an arena at a time: the load holds at most this much twice.
ARENA_BYTES = 64 << 20
ALIGN_BYTES = 64  # each array starts on a cache line
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25  # Linux 6.1: collapse the range now, in the caller, instead of by khugepaged later


@dataclass(frozen=True)
class Placed:
    """What a re-layout did: bytes of the arrays it moved, and of those now on 2 MB pages."""

    num_bytes: int
    huge_bytes: int

    def describe(self) -> str:
        return f"{self.huge_bytes / 2**20:.0f} of {self.num_bytes / 2**20:.0f} MB of weights on 2 MB pages"


def supported() -> bool:
    return sys.platform == "linux" and _libc() is not None


def relay(arrays: Sequence[mx.array]) -> tuple[list[mx.array], Placed]:
    """Views of 2 MB-aligned arenas holding `arrays`' bytes, in order, each row-contiguous with its
    shape and dtype. Arrays of other than 4-byte elements, and everything where huge pages are not
    supported, come back as they were."""
    if not supported():
        return list(arrays), Placed(0, 0)
    out, num_bytes, huge_bytes, group, group_bytes = list(arrays), 0, 0, list[int](), 0
    movable = [i for i, a in enumerate(arrays) if a.dtype.size == 4 and a.size > 0]
    for at, index in enumerate(movable):
        group.append(index)
        group_bytes += _padded(arrays[index].nbytes)
        if group_bytes >= ARENA_BYTES or at == len(movable) - 1:
            views, huge = _arena([arrays[i] for i in group])
            for i, view in zip(group, views, strict=True):
                out[i] = view
            num_bytes, huge_bytes, group, group_bytes = num_bytes + group_bytes, huge_bytes + huge, [], 0
    return out, Placed(num_bytes, huge_bytes)


def release_freed() -> None:
    """Gives the memory of freed arrays back to the system: MLX's buffer cache, then glibc's free lists.
    The weights a re-layout replaced sat below the 32 MB mmap threshold and the 1 GB trim threshold
    that engine/platform/allocator.py sets to keep activations mapped, so free() kept them; this one
    trim at load returns them, and the heap grows back to what the steps need."""
    mx.clear_cache()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialized numpy array starting on a 2 MB boundary; call `collapse` once it is filled."""
    num_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(num_bytes + HUGE_PAGE_BYTES, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    return raw[start : start + num_bytes].view(dtype).reshape(shape)


def gather(arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """Copies of numpy `arrays` in one arena on 2 MB pages (each at an ALIGN_BYTES boundary), and the
    arena's bytes on huge pages; the arrays as they were where huge pages are not supported."""
    if not supported() or not arrays:
        return list(arrays), 0
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end += _padded(a.nbytes)
    arena = aligned_empty((end,), np.uint8)
    copies = []
    for a, at in zip(arrays, offsets, strict=True):
        copy = arena[at : at + a.nbytes].view(a.dtype).reshape(a.shape)
        copy[...] = a
        copies.append(copy)
    return copies, collapse(arena.ctypes.data, end)


def collapse(address: int, num_bytes: int) -> int:
    """Puts the whole 2 MB pages of [address, address + num_bytes) on huge pages; returns their bytes
    (0 where the kernel refuses: no THP, an old kernel, no memory)."""
    libc = _libc()
    first = -(-address // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    length = (address + num_bytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES - first
    if libc is None or length <= 0:
        return 0
    start, size = ctypes.c_void_p(first), ctypes.c_size_t(length)
    libc.madvise(start, size, _MADV_HUGEPAGE)  # kept on 2 MB pages when the kernel later moves them
    if libc.madvise(start, size, _MADV_COLLAPSE) != 0:
        logger.debug("MADV_COLLAPSE refused: %s", os.strerror(ctypes.get_errno()))
        return 0
    return length


def _arena(arrays: list[mx.array]) -> tuple[list[mx.array], int]:
    """One arena holding `arrays`, views of it in their place, and its bytes on huge pages."""
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end += _padded(a.nbytes)
    arena = mx.zeros(((end + HUGE_PAGE_BYTES) // 4,), dtype=mx.uint32)
    mx.eval(arena, *arrays)
    memory = np.asarray(arena).view(np.uint8)
    base = -memory.ctypes.data % HUGE_PAGE_BYTES
    views = []
    for a, offset in zip(arrays, offsets, strict=True):
        at = base + offset
        memory[at : at + a.nbytes] = np.asarray(a).reshape(-1).view(np.uint8)
        first = at // 4
        views.append(arena[first : first + a.size].view(a.dtype).reshape(a.shape))
    mx.eval(views)
    return views, collapse(memory.ctypes.data + base, end)


def _padded(num_bytes: int) -> int:
    return -(-num_bytes // ALIGN_BYTES) * ALIGN_BYTES


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c") if sys.platform == "linux" else None
    libc = ctypes.CDLL(name, use_errno=True) if name else None
    if libc is not None:
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
