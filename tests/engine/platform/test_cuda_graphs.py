"""Importing the engine bounds MLX's CUDA graph cache without its lifetime-miss abort, unless the user
chose otherwise (engine/platform/cuda_graphs.py)."""

import os
import subprocess
import sys

from engine.platform.cuda_graphs import DEFAULTS

_SHOW = "import engine, os; print(os.environ['MLX_ENABLE_CACHE_THRASHING_CHECK'], os.environ['MLX_CUDA_GRAPH_CACHE_SIZE'])"


def _run(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    return subprocess.run(
        [sys.executable, "-c", _SHOW], env={**clean, **env}, capture_output=True, text=True, check=True
    ).stdout.split()


def test_the_engine_sets_the_defaults_on_import():
    assert _run({}) == ["0", "2048"]


def test_a_users_setting_is_kept():
    assert _run({"MLX_CUDA_GRAPH_CACHE_SIZE": "100", "MLX_ENABLE_CACHE_THRASHING_CHECK": "1"}) == ["1", "100"]
