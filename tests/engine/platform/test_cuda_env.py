"""Importing the engine sets MLX's CUDA defaults (a bounded graph cache without its lifetime-miss abort,
no cuDNN attention), unless the user chose otherwise (engine/platform/cuda_env.py)."""

import os
import subprocess
import sys

from engine.platform.cuda_env import DEFAULTS

_SHOW = "import engine, os; print(*(os.environ[k] for k in ('MLX_ENABLE_CACHE_THRASHING_CHECK', 'MLX_CUDA_GRAPH_CACHE_SIZE', 'MLX_CUDA_USE_CUDNN_SDPA')))"


def _run(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    return subprocess.run(
        [sys.executable, "-c", _SHOW], env={**clean, **env}, capture_output=True, text=True, check=True
    ).stdout.split()


def test_the_engine_sets_the_defaults_on_import():
    assert _run({}) == ["0", "2048", "0"]


def test_a_users_setting_is_kept():
    chosen = {
        "MLX_CUDA_GRAPH_CACHE_SIZE": "100",
        "MLX_ENABLE_CACHE_THRASHING_CHECK": "1",
        "MLX_CUDA_USE_CUDNN_SDPA": "1",
    }
    assert _run(chosen) == ["1", "100", "1"]
