"""The C forward's many-row float32 products through oneDNN's matmul (engine/runner/cpu/onednn.c).

oneDNN comes from PyPI (`onednn-cpu-gomp` and its headers, `onednn-devel-cpu-gomp`: the `cpu` extra on
Linux x86-64); its kernels are generated at run time for the CPU they run on (AVX-512, AVX2, SSE4.1).
The shim is built with the system C compiler into the per-user cache, as the forward is. Where any part
is missing the forward's products stay OpenBLAS's, and the server says why (`compute.prefill_matmul`).

At load, `attach` packs each layer's float32 weights once, checks that forwards through them give the
sgemm forwards' tokens with logits within float32 rounding of each other, and times whole forwards of
prefill-sized row counts both ways, alternating: the copies are kept only where they are faster on this
machine. They cost the float32 layers' size again in memory.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.runner.cpu import exact_pack, native_build
from engine.runner.cpu.matrix import Matrix, shapes_of

import numpy as np

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("onednn.c")
_RUNTIME = "onednn-cpu-gomp"  # libdnnl.so.3, OpenMP (GNU) threading
_HEADERS = "onednn-devel-cpu-gomp"  # oneapi/dnnl/dnnl.h
_ENTRY_POINTS = ("onednn_ready", "onednn_blocks", "onednn_rows")
FIRST_LAYER_WEIGHT = 3  # the forward's list: embedding, final norm, head, then the layers' weights
# Row counts the load-time measurement times whole forwards at: a prefill chunk's, at 16 clients about
# 200 to 500 rows.
MEASURE_ROWS = (64, 256)
MEASURE_REPS = 3
# Logits of the two paths may differ by the sums' rounding: this much of the largest logit's size.
LOGIT_TOLERANCE = 1e-3
# time_modes' answers in this process by what they depend on (the weights' shapes and formats, oneDNN's
# kernel, the forward's own rows and threads), not the weights' values: a second engine of one shape
# (a reload, a second model, the test suite's many) reuses them instead of ~2 s of timed forwards.
_TIMINGS: dict[tuple, dict[str, list[float]]] = {}


@dataclass
class OneDnn:
    """The built shim and the packed copies of one forward's weights (one pointer per weight of the
    forward's list, None where it has none), freed with this object."""

    lib: ctypes.CDLL
    handles: ctypes.Array
    impl: str  # the kernel oneDNN picked and its instructions, e.g. "brg:avx512_core for avx512_core_vnni"
    nbytes: int

    def __post_init__(self) -> None:
        self._live = list(filter(None, self.handles))  # the finalizer frees what is left of it
        weakref.finalize(self, _free, self.lib, self._live)

    def drop(self, index: int) -> None:
        """Frees weight `index`'s packed copy (another path multiplies it now): sgemm would take it again."""
        handle = self.handles[index]
        if handle:
            self.nbytes -= self.lib.onednn_bytes(handle)
            self._live.remove(handle)
            self.lib.onednn_free(handle)
            self.handles[index] = None

    @property
    def entry_points(self) -> tuple[int, int, int]:
        """onednn.c's onednn_ready, onednn_blocks and onednn_rows, for cpu_decode.c's configure_onednn."""
        points = [ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0 for name in _ENTRY_POINTS]
        assert all(points), "the shim exports its entry points"
        return points[0], points[1], points[2]


def unavailable() -> str | None:
    """Why oneDNN cannot serve here, or None."""
    if _library_path() is None:
        return f"oneDNN is not installed (pip install {_RUNTIME} {_HEADERS})"
    if _include_dir() is None:
        return f"oneDNN's headers are not installed (pip install {_HEADERS})"
    if native_build.compiler() is None:
        return "no C compiler"
    return None


def pack(weights: list[Matrix]) -> OneDnn | str:
    """The shim with every float32 layer weight of the forward's list packed (an exact packing's float32
    weights where it holds them), or why not: the shim did not build, oneDNN packed none, or the copies
    would take more than exact_pack's share of the memory available now."""
    found = {i: _floats(m) for i, m in enumerate(weights) if i >= FIRST_LAYER_WEIGHT}
    floats = {i: a for i, a in found.items() if a is not None}
    needed = sum(a.nbytes for a in floats.values())
    if needed > exact_pack.memory_budget():
        return f"oneDNN's copies ({needed / 2**20:.0f} MiB) would take over a quarter of the memory available"
    lib = _load()
    if lib is None:
        return "the oneDNN shim did not build (see the log)"
    handles = (ctypes.c_void_p * len(weights))()
    impl = ctypes.create_string_buffer(64)
    nbytes, impls = 0, set()
    for i, array in floats.items():
        out, width = array.shape
        handle = lib.onednn_weight(array.ctypes.data, out, width, impl)
        if not handle:
            logger.info("oneDNN: no matmul for a (%d, %d) weight; its products stay sgemm's", out, width)
            continue
        handles[i] = handle
        nbytes += lib.onednn_bytes(handle)
        impls.add(impl.value.decode())
    if not nbytes:
        return "oneDNN has no matmul for these weights"
    return OneDnn(lib, handles, f"{'/'.join(sorted(impls))} for {lib.onednn_isa().decode()}", nbytes)


def _floats(matrix: Matrix) -> np.ndarray | None:
    """The float32 weights sgemm reads for `matrix`: its own, or those an exact packing stands for."""
    floats = matrix.source if matrix.exact else None if matrix.bits else matrix.arrays[0]
    return floats if floats is not None and floats.ndim == 2 else None


def _free(lib: ctypes.CDLL, handles: list[int]) -> None:
    for handle in handles:
        lib.onednn_free(handle)


def _files(distribution: str) -> list[Path]:
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(str(f.locate())) for f in files]


def _library_path() -> Path | None:
    return next((p for p in _files(_RUNTIME) if p.name == "libdnnl.so.3" and p.exists()), None)


def _include_dir() -> Path | None:
    header = next((p for p in _files(_HEADERS) if p.as_posix().endswith("oneapi/dnnl/dnnl.h")), None)
    return header.parents[2] if header is not None and header.exists() else None


def _load() -> ctypes.CDLL | None:
    """The shim, built once per source, oneDNN and compiler into the cache; None where it cannot be."""
    library, include, compiler = _library_path(), _include_dir(), native_build.compiler()
    if library is None or include is None or compiler is None:
        return None
    flags = ["-O2", "-shared", "-fPIC", "-pthread", f"-I{include}"]
    links = [str(library), "-lgomp", f"-Wl,-rpath,{library.parent}"]
    key = _key([compiler, *flags, *links])
    target = native_build.compiled(
        "onednn", key, [compiler, *flags, str(_SOURCE)], links, "products stay sgemm's"
    )
    if target is None:
        return None
    lib = ctypes.CDLL(str(target))
    lib.onednn_weight.restype = ctypes.c_void_p
    lib.onednn_weight.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p]
    lib.onednn_bytes.restype = ctypes.c_size_t
    lib.onednn_bytes.argtypes = [ctypes.c_void_p]
    lib.onednn_isa.restype = ctypes.c_char_p
    lib.onednn_free.argtypes = [ctypes.c_void_p]
    return lib


def _key(command: list[str]) -> str:
    return hashlib.sha256(_SOURCE.read_bytes() + " ".join(command).encode()).hexdigest()[:16]


class Forward(Protocol):
    """What `choose` needs of the C forward (engine/runner/cpu/cpu_decode.py's CpuDecode)."""

    onednn: OneDnn | None  # the copies its many-row products read, or None: sgemm
    direct_rows: int

    @property
    def threads(self) -> int: ...

    @property
    def build(self) -> str: ...

    @property
    def matrices(self) -> list[Matrix]: ...

    def chunk_logits(self, rows: int) -> np.ndarray: ...

    def scratch_forward(self, rows: int) -> Callable[[int], float]: ...


def choose(decode: Forward) -> tuple[OneDnn | None, str]:
    """oneDNN's copies of `decode`'s weights where forwards through them give sgemm's tokens (logits
    within float32 rounding) and are faster here, else None; and what the status says of it."""
    if reason := unavailable():
        return None, f"sgemm ({reason})"
    began = time.perf_counter()
    packed = pack(decode.matrices)
    if isinstance(packed, str):
        return None, f"sgemm ({packed})"
    if not _agrees(decode, packed):
        logger.warning("C forward: oneDNN's products changed the logits; keeping sgemm")
        return None, "sgemm (oneDNN's logits differed from sgemm's at load)"
    key = _timing_key(decode, packed)
    if key not in _TIMINGS:  # a second forward of one shape in this process reuses the first's
        _TIMINGS[key] = time_modes(
            lambda rows: _timer(decode, rows), lambda on: setattr(decode, "onednn", packed if on else None)
        )
    timed = _TIMINGS[key]
    described = describe(timed)
    kept = packed if faster(timed) else None
    text = f"oneDNN {packed.impl} ({packed.nbytes / 2**20:.0f} MiB of packed weights; {described})"
    text = text if kept else f"sgemm (oneDNN slower here: {described})"
    logger.info(
        "C forward: many-row products through %s, decided in %.1f s", text, time.perf_counter() - began
    )
    return kept, text


def _agrees(decode: Forward, packed: OneDnn) -> bool:
    """Whether a forward of a few blocks' rows (scratch pools) gives close_logits both ways."""
    rows = 67  # two row blocks a product: rows past the own matmuls' 32, uneven
    decode.onednn = None
    sgemm = decode.chunk_logits(rows)
    decode.onednn = packed
    try:
        return close_logits(sgemm, decode.chunk_logits(rows))
    finally:
        decode.onednn = None


def _timing_key(decode: Forward, packed: OneDnn) -> tuple:
    return decode.build, shapes_of(decode.matrices), packed.impl, decode.direct_rows, decode.threads


def _timer(decode: Forward, rows: int) -> Callable[[], float]:
    forward = decode.scratch_forward(rows)
    return lambda: forward(decode.direct_rows)


def close_logits(first: np.ndarray, second: np.ndarray) -> bool:
    """Whether two forwards' logits (rows, vocab) agree as two float32 summation orders do: the same
    argmax in every row, every logit within LOGIT_TOLERANCE of the row's largest magnitude."""
    if first.shape != second.shape or not (np.isfinite(first).all() and np.isfinite(second).all()):
        return False
    scale = np.abs(first).max(axis=1, keepdims=True)
    if (np.abs(first - second) > LOGIT_TOLERANCE * scale).any():
        return False
    return bool((first.argmax(axis=1) == second.argmax(axis=1)).all())


def faster(timed: dict[str, list[float]], modes: tuple[str, str] = ("onednn", "sgemm")) -> bool:
    """From whole-forward seconds per mode (the new one first, then the one it would replace) at the
    measured row counts (the fastest of each), whether the new one's total is lower."""
    return sum(timed[modes[0]]) < sum(timed[modes[1]])


def describe(
    timed: dict[str, list[float]],
    modes: tuple[str, str] = ("onednn", "sgemm"),
    row_counts: tuple[int, ...] = MEASURE_ROWS,
) -> str:
    """time_modes' answer as the status says it: "64 rows 1.0 against 2.0 ms, ..." (the first mode, then
    the second)."""
    return ", ".join(
        f"{rows} rows {one * 1e3:.1f} against {two * 1e3:.1f} ms"
        for rows, one, two in zip(row_counts, timed[modes[0]], timed[modes[1]], strict=True)
    )


def time_modes(
    forward_of: Callable[[int], Callable[[], float]],
    use: Callable[[bool], None],
    modes: tuple[str, str] = ("onednn", "sgemm"),
    row_counts: tuple[int, ...] = MEASURE_ROWS,
) -> dict[str, list[float]]:
    """The fastest whole forward at each of `row_counts` in each mode, the two alternating:
    forward_of(rows) -> a callable that runs one forward and returns its seconds; use(on) switches
    the first mode (oneDNN, say) on or off (left off)."""
    timed: dict[str, list[float]] = {mode: [] for mode in modes}
    for rows in row_counts:
        forward = forward_of(rows)
        best = dict.fromkeys(modes, float("inf"))
        for _ in range(MEASURE_REPS):
            for mode in modes:
                use(mode == modes[0])
                best[mode] = min(best[mode], forward())
        for mode, seconds in best.items():
            timed[mode].append(seconds)
    use(False)
    return timed
