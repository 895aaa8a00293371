"""Models whose layers attend through sliding windows decode, with every fast path left at its default,
the tokens mlx-lm's own `generate_step` decodes, on prompts longer than the window; and the fast paths
that do not model a window step aside and say why in /v1/status `compute.not_taken`.

Each architecture marks its windowed layers its own way (mistral: `layer_types` through mlx-lm's llama,
gpt_oss and olmo3: `layer_types`, exaone4: `is_local` from `sliding_window_pattern`); all of them give
those layers a RotatingKVCache in `make_cache()`, which is what the fast paths ask.
"""

from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.runner.cpu.activation_hook import stock

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.generate import generate_step

from tests.engine.engine_helpers import run_to_completion, token_ids
from tests.tiny_text_model import build_tiny_model

WINDOW = 8
PROMPT_LENS = (30, 34, 38)  # longer than the window; close enough in length for paired prefill
MAX_TOKENS = 12
MODELS = {
    "mistral": {
        "model_type": "mistral",
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        "sliding_window": WINDOW,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
    },
    "olmo3": {"model_type": "olmo3", "sliding_window": WINDOW},  # layers 1-3 windowed, layer 4 full
    "exaone4": {
        "model_type": "exaone4",
        "sliding_window": WINDOW,
        "sliding_window_pattern": "LLLG",  # mlx-lm reads this one
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],  # transformers' config, this one
        "rope_scaling": None,
    },
}
# The CPU fast paths that would serve these float32 models on this machine if windows did not matter.
WINDOW_BLIND = ("c_forward", "paired_prefill", "window_attention")


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(20, vocab_size, size=n).tolist() for n in PROMPT_LENS]


def _reference(model: nn.Module, prompt: list[int]) -> list[int]:
    """mlx-lm's own greedy tokens, with its own activations (the engine swaps some in the model's modules)."""
    with stock(model):
        steps = generate_step(mx.array(prompt), model, max_tokens=MAX_TOKENS)
        return [int(token) for token, _ in steps]


@pytest.mark.parametrize("model_type", MODELS)
def test_a_windowed_model_decodes_what_mlx_lm_decodes(model_type: str, tmp_path: Path):
    path = build_tiny_model(tmp_path / model_type, MODELS[model_type])
    llm = LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=8 << 20))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = _prompts(llm.vocab_size)
    # Arriving together: prefill chunks in one step (paired where that path serves), then batched decode.
    outputs = run_to_completion(llm, {0: [GenerateRequest(str(i), p, params) for i, p in enumerate(prompts)]})
    got = [token_ids(outputs[str(i)]) for i in range(len(prompts))]
    assert got == [_reference(llm.runner.model, p) for p in prompts]

    compute = llm.stats().compute
    assert compute is not None
    for name in WINDOW_BLIND:
        assert "RotatingKVCache" in compute.not_taken.get(name, ""), (name, compute)
    assert (compute.decode, compute.attention, compute.prefill) == ("mlx", "gather", "one_at_a_time")
    assert compute.math == "cpu_math"  # it takes each layer's own mask: the tokens above check it
