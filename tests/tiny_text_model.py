"""Builds tiny random-weight text models of any mlx-lm architecture as model directories: mlx-lm's own
classes draw the weights, and the bundled SmolLM2 tokenizer, cut to the model's vocabulary (its first
`vocab_size` ids, the same strings), serves every model. The models run the real code paths; their
tokens mean nothing.
"""

from __future__ import annotations

import functools
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.models.default_model import resolve_model_path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import MODEL_REMAPPING

VOCAB_SIZE = 512  # the tiny models' vocabulary: the bundled tokenizer's first 512 ids
# The common shape: hidden 64, 4 heads of 16 over 2 KV heads. A config overrides or adds fields.
BASE_CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10_000.0,
    "max_position_embeddings": 4096,
    "vocab_size": VOCAB_SIZE,
    "tie_word_embeddings": False,
}


def build_tiny_model(out: Path, config: dict, seed: int = 0) -> Path:
    """`out` as an mlx-lm model directory of `config` (over BASE_CONFIG; `model_type` required)."""
    out.mkdir(parents=True, exist_ok=True)
    source = Path(resolve_model_path(EngineConfig().model, "float32"))
    full = {**BASE_CONFIG, "eos_token_id": json.loads((source / "config.json").read_text())["eos_token_id"]}
    full.update(config)
    save_cut_tokenizer(out, _largest_vocab(full))
    (out / "config.json").write_text(json.dumps(full, indent=1))
    model_type = MODEL_REMAPPING.get(full["model_type"], full["model_type"])
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)  # the model's own initializers draw the random weights
    model = module.Model(module.ModelArgs.from_dict(full))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def save_cut_tokenizer(out: Path, vocab_size: int) -> None:
    """The bundled SmolLM2 tokenizer's files in `out`, with only its first `vocab_size` ids."""
    source = Path(resolve_model_path(EngineConfig().model, "float32"))
    (out / "tokenizer.json").write_text(_tokenizer_json(source, vocab_size))
    shutil.copy(source / "tokenizer_config.json", out / "tokenizer_config.json")


def _largest_vocab(config: Any) -> int:
    """The largest `vocab_size` anywhere in the config (a text_config may set its own)."""
    if isinstance(config, dict):
        own = config.get("vocab_size")
        return max([own if isinstance(own, int) else 0, *(_largest_vocab(v) for v in config.values())])
    return 0


@functools.cache
def _tokenizer_json(source: Path, vocab_size: int) -> str:
    """The source's tokenizer.json with only its ids below `vocab_size` and the merges among them.
    mlx-lm and transformers walk every token at each load: 0.7 s for SmolLM2's 49,152, 0.01 s for 512,
    paid once per tiny model. Ids below 252 hold the special tokens and every byte-level symbol
    SmolLM2 has, so text encodes as with the full tokenizer, in more tokens; ids decode to the same text."""
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    bpe = tokenizer["model"]
    if vocab_size >= len(bpe["vocab"]):
        return json.dumps(tokenizer)
    vocab = {token: i for token, i in bpe["vocab"].items() if i < vocab_size}
    bpe["vocab"] = vocab
    bpe["merges"] = [m for m in bpe["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] < vocab_size]
    return json.dumps(tokenizer)
