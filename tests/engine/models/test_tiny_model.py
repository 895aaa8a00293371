"""`testing:tiny-64k`: a real mlx-lm model directory with a 64k window, the bundled tokenizer, a template
that reads `enable_thinking`, and replies that end by sampling (about 1 / EOS_PROBABILITY tokens)."""

from __future__ import annotations

import json

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.models import tiny_model
from engine.models.default_model import resolve_model_path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler


@pytest.fixture(scope="module")
def loaded():
    path = resolve_model_path(tiny_model.NAME)
    return path, *load(path)


def test_the_name_resolves_to_a_built_directory_with_a_64k_window(loaded):
    path, model, _ = loaded
    config = json.loads((tiny_model.model_dir() / "config.json").read_text())
    assert path == str(tiny_model.model_dir()) and config["max_position_embeddings"] == 65536
    assert sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters())) < 10_000_000


def test_an_unknown_testing_name_is_refused():
    with pytest.raises(ValueError, match="testing:tiny-64k"):
        resolve_model_path("testing:tiny-1m")


def test_the_template_reads_enable_thinking(loaded):
    _, _, tokenizer = loaded
    messages = [{"role": "user", "content": "hi"}]
    plain = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    on = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, enable_thinking=True
    )
    assert on == plain + "<think>\n"


def test_sampled_replies_end_and_greedy_ones_run_on(loaded):
    _, model, tokenizer = loaded
    prompt = mx.array(
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    )
    lengths = []
    for seed in range(12):
        mx.random.seed(seed)
        tokens = [t for t, _ in generate_step(prompt, model, sampler=make_sampler(temp=1.0), max_tokens=400)]
        lengths.append(tokens.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in tokens else 400)
    assert 5 < sum(lengths) / len(lengths) < 80, lengths  # about 1 / EOS_PROBABILITY = 20
    greedy = [t for t, _ in generate_step(prompt, model, sampler=make_sampler(temp=0.0), max_tokens=50)]
    assert tokenizer.eos_token_id not in greedy
