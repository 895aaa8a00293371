"""The BLAS the engine loads picks its kernels at run time: it reports DYNAMIC_ARCH, and forced onto the
kernels of older x86-64 CPUs (OPENBLAS_CORETYPE) the engine still loads and decodes the same tokens."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.platform.blas import blas_state, exported_names

import pytest

REPO = Path(__file__).resolve().parents[3]
MAX_TOKENS = 24
# OPENBLAS_CORETYPE -> the cores OpenBLAS may report for it: a build without a core's own kernels
# serves it with the nearest older ones (scipy-openblas32 runs Prescott on Katmai's, Zen on Haswell's).
FORCED_CORES = {
    "Prescott": {"Prescott", "Katmai"},
    "Nehalem": {"Nehalem"},
    "Sandybridge": {"Sandybridge"},
    "Haswell": {"Haswell"},
    "Zen": {"Zen", "Haswell"},
    "SkylakeX": {"SkylakeX"},
}


def _cpu_flags() -> set[str]:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return set(next((line for line in lines if line.startswith("flags")), "").split())


def test_the_loaded_openblas_picks_its_kernels_at_run_time():
    blas = blas_state()
    assert blas.name == "openblas", blas.reason
    assert blas.config is not None and "DYNAMIC_ARCH" in blas.config.split(), blas.config
    assert blas.core and blas.core in blas.config
    # The copy's symbols carry the names MLX binds, none of scipy-openblas32's prefixed ones.
    names = set(exported_names(Path(blas.path), ""))
    assert {"cblas_sgemm", "sgetrf_", "openblas_get_corename"} <= names
    assert not any(name.startswith("scipy_") for name in names)


def _probe(coretype: str | None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    command = [sys.executable, "-m", "tests.engine.greedy_probe", str(MAX_TOKENS)]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(probe: subprocess.Popen) -> dict:
    out, err = probe.communicate(timeout=300)
    assert probe.returncode == 0, f"exit {probe.returncode}: {err.decode()[-2000:]}"
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 core names")
def test_every_x86_core_loads_the_engine_and_decodes_the_same_tokens():
    coretypes = [c for c in FORCED_CORES if c != "SkylakeX" or "avx512f" in _cpu_flags()]
    default = _result(_probe(None))
    assert default["decode"] == "c_forward" and len(default["tokens"][0]) == MAX_TOKENS
    for first in range(0, len(coretypes), 2):  # two processes at a time, one BLAS thread each
        batch = coretypes[first : first + 2]
        for coretype, probe in [(c, _probe(c)) for c in batch]:
            result = _result(probe)
            assert result["core"] in FORCED_CORES[coretype], (coretype, result["config"])
            assert result["tokens"] == default["tokens"], coretype


# After one sgemm on 2 threads: the CPU time (ns) OpenBLAS's other threads spend in the next 0.3 s.
SPIN_PROBE = """
import ctypes, os, time
import engine
from engine.platform.blas import blas_state
lib = ctypes.CDLL(blas_state().path)
n = 256
a = (ctypes.c_float * (n * n))()
c = (ctypes.c_float * (n * n))()
def busy():
    me, total = os.getpid(), 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            total += int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
    return total
lib.cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1), a, n, a, n, ctypes.c_float(0), c, n)
before = busy()
time.sleep(0.3)
print(busy() - before)
"""


def test_openblas_threads_sleep_soon_after_a_call_unless_the_user_says_otherwise():
    """Its threads spin 2^20 cycles (well under 1 ms) after a call, not OpenBLAS's 2^28 (about 0.1 s;
    engine/platform/blas.py); a user's own OPENBLAS_THREAD_TIMEOUT is kept."""
    spun_ms = {}
    for user in (None, "28"):
        env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="2")
        env.pop("OPENBLAS_THREAD_TIMEOUT", None)
        if user is not None:
            env["OPENBLAS_THREAD_TIMEOUT"] = user
        out = subprocess.run(
            [sys.executable, "-c", SPIN_PROBE],
            check=False,
            env=env,
            cwd=REPO,
            capture_output=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        spun_ms[user] = int(out.stdout.decode().split()[-1]) / 1e6
    assert spun_ms[None] < 10 and spun_ms["28"] > 30, spun_ms
