"""llama.cpp for `bench/serve.py`: the C++ `llama-server` and `llama-quantize` built from the llama.cpp
source vendored in the llama-cpp-python sdist, and the float32 GGUF made from the bundled Q4_1 one.

Owns `<cache>/bench-llama/` (the unpacked sdist, the cmake build, the f32 GGUF), each made once and
reused after (marker files); a build directory passed in (`--llama-build`) is used as it is, only
the missing targets are built in it. It never starts a server (bench/serve_proc.py does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the sdist whose vendor/llama.cpp both llama peers run
SDIST_DIR = "llama_cpp_python-0.3.36"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # the web UI is the build's only download
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
]
TARGETS = ("llama-server", "llama-quantize")
F32_GGUF = "SmolLM2-135M-Instruct.F32.gguf"


def root(cache: Path) -> Path:
    return cache / "bench-llama"


def binary(build: Path, target: str) -> Path:
    return build / "bin" / target


def ensure_build(cache: Path, build: Path | None, log: Callable[[str], None]) -> dict:
    """The build directory holding every target of TARGETS: `build` if given, else ours under the cache
    (sdist downloaded, configured and built on first use). Returns what the JSON records about it."""
    own = build is None
    build = build or root(cache) / "build"
    marker = build / ".bench-built"
    missing = [t for t in TARGETS if not binary(build, t).exists()]
    if own and not marker.exists():
        missing = list(TARGETS)  # an interrupted build of ours: let cmake finish whatever it left
    if not missing:
        return {"dir": str(build), "built_now_s": None, "cmake_flags": _configured_flags(build)}
    t0 = time.monotonic()
    if not (build / "CMakeCache.txt").exists():
        if not own:
            raise RuntimeError(f"--llama-build {build} is not a cmake build directory (no CMakeCache.txt)")
        _configure(_source(cache, log), build, log)
    log(f"[llama.cpp] cmake --build {build} --target {' '.join(missing)} (about 20 min on 2 cores)")
    _run(["cmake", "--build", str(build), "--target", *missing, "-j", str(os.cpu_count() or 1)])
    if own:
        marker.write_text(json.dumps(list(TARGETS)))
    seconds = round(time.monotonic() - t0, 1)
    log(f"[llama.cpp] built {', '.join(missing)} in {seconds:.0f} s")
    return {"dir": str(build), "built_now_s": seconds, "cmake_flags": _configured_flags(build)}


def _source(cache: Path, log: Callable[[str], None]) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist, downloaded (pip, no binary) and unpacked once."""
    src = root(cache) / "src"
    llama = src / SDIST_DIR / "vendor" / "llama.cpp"
    if (llama / "CMakeLists.txt").exists():
        return llama
    log(f"[llama.cpp] pip download --no-binary=:all: {LLAMA_CPP_PYTHON}")
    src.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
          "-d", str(src), LLAMA_CPP_PYTHON])  # fmt: skip
    with tarfile.open(src / f"{SDIST_DIR}.tar.gz") as tar:
        tar.extractall(src, filter="data")
    return llama


def _configure(source: Path, build: Path, log: Callable[[str], None]) -> None:
    log(f"[llama.cpp] cmake -S {source} -B {build} {' '.join(CMAKE_FLAGS)}")
    _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS])


def _configured_flags(build: Path) -> dict[str, str]:
    """The CMakeCache values of CMAKE_FLAGS' variables, so the JSON shows how a reused build was made."""
    wanted = {flag[2:].split("=")[0] for flag in CMAKE_FLAGS}
    values = {}
    for line in _read(build / "CMakeCache.txt").splitlines():
        name, _, value = line.partition("=")
        if name.split(":")[0] in wanted:
            values[name.split(":")[0]] = value
    return values


def f32_gguf_path(cache: Path) -> Path:
    return root(cache) / "gguf" / F32_GGUF


def ensure_f32_gguf(cache: Path, build: Path, q4_1_gguf: Path, log: Callable[[str], None]) -> Path:
    """The Q4_1 GGUF dequantized to float32 by `llama-quantize --allow-requantize ... F32`, made once."""
    out = f32_gguf_path(cache)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    log(f"[llama.cpp] llama-quantize --allow-requantize {q4_1_gguf.name} -> {out.name} F32")
    _run([str(binary(build, "llama-quantize")), "--allow-requantize", str(q4_1_gguf), str(partial), "F32"])
    partial.rename(out)
    return out


def server_version(build: Path) -> str | None:
    """`llama-server --version` (it prints to stderr): "version: N (commit)" and the compiler line."""
    cmd = [str(binary(build, "llama-server")), "--version"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [
        ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.startswith(("version", "built"))
    ]
    return "; ".join(lines) or None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:6])} ... failed ({res.returncode}): {(res.stderr or res.stdout)[-2000:]}"
        )
