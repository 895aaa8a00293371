"""Builds `testing:tiny-64k`: a tiny random-weight Llama with a 65,536-token window, for testing clients.

Owns its cache folder (cache_dir()/models/tiny-64k-seed<N>); it never loads a model. Real agent prompts
(Claude Code's system prompt and tools: about 20k tokens) do not fit the bundled model's 8k window, and
prefilling them through 135M parameters takes minutes on a CPU. This model (2 layers, width 64) takes
them in seconds. Its replies are random tokens: it tests protocols, never answers.

- Tokenizer: the bundled SmolLM2's, with its ChatML template plus an `enable_thinking` switch (true:
  the reply opens with `<think>`, as reasoning models' templates do), so that template variables
  (chat_template_kwargs, Anthropic `thinking`) can be seen to arrive.
- End of reply: the residual stream carries one constant dimension that only `<|im_end|>`'s output row
  and a few common words' rows read, so sampling at temperature 1 ends a reply after about
  1 / EOS_PROBABILITY tokens, most of them those words. Greedy decoding picks a word, never the end:
  greedy replies run to max_tokens.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from engine.platform.paths import build_once, cache_dir

NAME = "testing:tiny-64k"
MAX_MODEL_LEN = 65536
EOS_PROBABILITY = 0.05  # per sampled token at temperature 1: replies of about 20 tokens
_STEADY_DIM, _STEADY_VALUE = 0, 8.0
FILLER_WORDS = (" the", " a", " and", " to", " of", " is", " it", " in")
_FILLER_MARGIN = 0.5  # their logits sit this far above EOS's: greedy picks one of them
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
THINKING_SWITCH = "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}{%- endif %}"


def model_dir(seed: int = 0) -> Path:
    return cache_dir() / "models" / f"tiny-64k-v2-seed{seed}"  # v2: the thinking switch opens <think>


def ensure_tiny_model(tokenizer_source: Path, seed: int = 0) -> Path:
    """The built directory, with `tokenizer_source`'s tokenizer (the bundled model's); built once, to a
    temporary folder renamed into place, under a file lock."""
    return build_once(model_dir(seed), lambda folder: _build(folder, tokenizer_source, seed))


def config(vocab_size: int, eos_token_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": MAX_MODEL_LEN,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": eos_token_id,
    }


def _build(out: Path, source: Path, seed: int) -> None:
    for name in _TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = tokenizer_config["chat_template"] + THINKING_SWITCH
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    source_config = json.loads((source / "config.json").read_text())
    model_config = config(source_config["vocab_size"], source_config["eos_token_id"])
    (out / "config.json").write_text(json.dumps(model_config, indent=1))
    _save_weights(out, model_config, seed, _filler_ids(out))


def _filler_ids(out: Path) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    return [tokenizer.encode(word, add_special_tokens=False).ids[0] for word in FILLER_WORDS]


def _save_weights(out: Path, model_config: dict, seed: int, filler_ids: list[int]) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(seed)  # the model's own initializers draw the random weights
    model = Model(ModelArgs.from_dict(model_config))
    weights = dict(tree_flatten(model.parameters()))
    _add_steady_eos(weights, model_config, filler_ids)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def _add_steady_eos(weights: dict, model_config: dict, filler_ids: list[int]) -> None:
    """One residual dimension holds a constant that no layer writes to and only EOS's and the filler
    words' logits read."""
    import mlx.core as mx

    dim, eos = _STEADY_DIM, model_config["eos_token_id"]
    embed = weights["model.embed_tokens.weight"]
    embed[:, dim] = _STEADY_VALUE
    for i in range(model_config["num_hidden_layers"]):
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            weights[f"model.layers.{i}.{name}.weight"][dim, :] = 0.0
    head = weights["lm_head.weight"]
    head[:, dim] = 0.0
    eos_logit = _eos_logit(model_config, len(filler_ids))
    steady = math.sqrt(model_config["hidden_size"])  # the dimension's value after the final RMSNorm
    head[eos, dim] = eos_logit / steady
    for token_id in filler_ids:
        head[token_id, dim] = (eos_logit + _FILLER_MARGIN) / steady
    mx.eval(list(weights.values()))


def _eos_logit(model_config: dict, num_fillers: int) -> float:
    """EOS's logit for EOS_PROBABILITY at temperature 1. After the final RMSNorm the steady dimension
    reads about sqrt(hidden) (it dominates the norm) and the others about 1 / sqrt(hidden) each, so the
    other logits are small and their exp() sum to about the vocabulary size V. With x = exp(eos_logit)
    and f = exp(margin): p = x / (x + n f x + V), so x = p V / (1 - p (1 + n f))."""
    p, vocab = EOS_PROBABILITY, model_config["vocab_size"]
    fillers = num_fillers * math.exp(_FILLER_MARGIN)
    return math.log(p * vocab / (1 - p * (1 + fillers)))
