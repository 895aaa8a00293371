"""Every architecture of the installed mlx-lm, as a tiny random-weight model (tests/architectures.py), decodes
through the engine the tokens mlx-lm's own `generate_step` decodes:

- a mixed batch of prompts shorter and longer than any window (8 tokens), arriving together;
- the longest prompt again, through the prefix cache where the model has one;
- the same batch under a 24-token prefill budget (chunked prefill) on 10 KV blocks, where running
  requests are preempted and recomputed in the middle of decoding;
- the mixed batch again with each fast path that served it forced off.

No architecture is refused: one that the engine cannot serve fails here.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.runner.cpu.activation_hook import stock

import mlx.core as mx
import mlx_lm
import mlx_lm.utils
import numpy as np
import pytest
from mlx import nn
from mlx_lm.generate import generate_step

from tests.architectures import (
    ARCHITECTURES,
    CRASHES_IN_MLX,
    METAL_ONLY,
    NEEDS_PACKAGE,
    PROMPT_SPLIT_CHANGES_OUTPUT,
    SEEDS,
    TOKENIZER_REJECTS,
    installed_architectures,
)
from tests.engine.engine_helpers import run_to_completion, token_ids
from tests.tiny_text_model import build_tiny_model

PROMPT_LENS = (7, 30, 45, 100)
MAX_TOKENS = 10
# EngineConfig setting of each fast path, by the name /v1/status gives it.
SETTINGS = {
    "c_forward": "cpu_decode",
    "cpu_math": "cpu_math",
    "window_attention": "kv_in_place",
    "paired_prefill": "paired_prefill",
    "cuda_fused": "cuda_fused",
    "cuda_graph": "cuda_graph",
}
BUDGET = {"kv_cache_memory_bytes": 16 << 20, "max_num_seqs": 8}


def test_the_list_names_every_installed_architecture():
    """A new mlx-lm architecture fails here until it has a tiny config in tests/architectures.py."""
    listed = [*ARCHITECTURES, *METAL_ONLY, *NEEDS_PACKAGE, *TOKENIZER_REJECTS, *CRASHES_IN_MLX]
    assert len(listed) == len(set(listed)), "an architecture is listed twice"
    installed = set(installed_architectures())
    assert installed - set(listed) == set(), "add these to tests/architectures.py"
    assert set(listed) - installed == set(), "mlx-lm no longer ships these"


@pytest.mark.parametrize("arch", sorted(METAL_ONLY))
def test_metal_only_architectures_need_metal(arch: str):
    assert not mx.metal.is_available(), f"Metal is here: move {arch} to ARCHITECTURES"


@pytest.mark.parametrize("arch", sorted(NEEDS_PACKAGE))
def test_an_architecture_that_needs_a_package_still_needs_it(arch: str):
    with pytest.raises(SystemExit):  # mlx-lm's module exits the process when the package is missing
        importlib.import_module(f"mlx_lm.models.{arch}")


@pytest.mark.parametrize("arch", sorted(TOKENIZER_REJECTS))
def test_an_architecture_whose_config_transformers_rejects_fails_in_mlx_lm_too(arch: str, tmp_path: Path):
    """mlx-lm cannot load it, so the engine reports why at load rather than serving anything."""
    path = build_tiny_model(tmp_path / arch, TOKENIZER_REJECTS[arch])
    with pytest.raises(Exception, match="layer_types"):  # transformers' own validation error
        mlx_lm.load(str(path))
    with pytest.raises(ModelLoadError, match="layer_types"):
        _engine(path)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(20, 500, size=n).tolist() for n in PROMPT_LENS]


def _reference(model: nn.Module, prompt: list[int], arch: str) -> list[int]:
    with stock(model):  # mlx-lm's own activations (the engine swaps some into the model's modules)
        if arch in PROMPT_SPLIT_CHANGES_OUTPUT:
            return _one_call_prefill(model, prompt)
        return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=MAX_TOKENS)]


def _one_call_prefill(model: nn.Module, prompt: list[int]) -> list[int]:
    """Greedy tokens with mlx-lm's classes and caches, the whole prompt in one call."""
    cache = model.make_cache()
    logits = model(mx.array([prompt]), cache=cache)
    tokens: list[int] = []
    while len(tokens) < MAX_TOKENS:
        tokens.append(int(mx.argmax(logits[0, -1])))
        logits = model(mx.array([tokens[-1:]]), cache=cache)
    return tokens


@pytest.fixture(autouse=True)
def _one_tokenizer_load_per_model(monkeypatch):
    """The engines of one test load one model's tokenizer files: once is enough (0.01 to 0.02 s each time
    for the tiny models' 512-token tokenizers: about 5 s over the module)."""
    original, loaded = mlx_lm.utils.load_tokenizer, {}

    def load_tokenizer(model_path, *args, **kwargs):
        key = (str(model_path), repr(args), repr(sorted(kwargs.items())))
        if key not in loaded:
            loaded[key] = original(model_path, *args, **kwargs)
        return loaded[key]

    monkeypatch.setattr(mlx_lm.utils, "load_tokenizer", load_tokenizer)


def _run(llm: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    outputs = run_to_completion(llm, {0: requests})
    return [token_ids(outputs[f"r{i}"]) for i in range(len(prompts))]


def _engine(path: Path, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), **{**BUDGET, **settings}))


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_architecture_decodes_what_mlx_lm_decodes(arch: str, tmp_path: Path):
    path = build_tiny_model(tmp_path / arch, ARCHITECTURES[arch], seed=SEEDS.get(arch, 0))
    prompts = _prompts()
    llm = _engine(path)
    expected = [_reference(llm.runner.model, p, arch) for p in prompts]
    assert _run(llm, prompts) == expected, "mixed batch"

    before = llm.stats().prefix_cache_hits
    assert _run(llm, prompts[-1:]) == expected[-1:], "prefix-cache re-run"
    if llm.prefix_caching_off is None:
        assert llm.stats().prefix_cache_hits > before, "the re-run found its prefix"

    small = _engine(path, max_num_batched_tokens=24, num_kv_blocks=10)
    chunked = _run(small, prompts)
    assert small.scheduler.num_preemptions > 0
    if arch not in PROMPT_SPLIT_CHANGES_OUTPUT:  # its output depends on where chunks end, in mlx-lm too
        assert chunked == expected, "chunked prefill with preemption"

    compute = llm.stats().compute
    assert compute is not None
    taken = {compute.decode, compute.math, compute.attention, compute.prefill} & set(SETTINGS)
    for name in sorted(taken):
        off = _engine(path, **{SETTINGS[name]: False})
        assert name in off.stats().compute.not_taken  # type: ignore[union-attr]
        assert _run(off, prompts) == expected, f"{name} off"
