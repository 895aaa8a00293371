"""Builds tiny random-weight text models of any mlx-lm architecture as model directories: mlx-lm's own
classes draw the weights, and the bundled SmolLM2 tokenizer serves every model (its ids cover any
vocabulary up to its own size). The models run the real code paths; their tokens mean nothing.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.models.default_model import resolve_model_path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import MODEL_REMAPPING

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
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
    "vocab_size": 512,
    "tie_word_embeddings": False,
}


def build_tiny_model(out: Path, config: dict, seed: int = 0) -> Path:
    """`out` as an mlx-lm model directory of `config` (over BASE_CONFIG; `model_type` required)."""
    out.mkdir(parents=True, exist_ok=True)
    source = Path(resolve_model_path(EngineConfig().model, "float32"))
    for name in _TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    full = {**BASE_CONFIG, "eos_token_id": json.loads((source / "config.json").read_text())["eos_token_id"]}
    full.update(config)
    (out / "config.json").write_text(json.dumps(full, indent=1))
    model_type = MODEL_REMAPPING.get(full["model_type"], full["model_type"])
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)  # the model's own initializers draw the random weights
    model = module.Model(module.ModelArgs.from_dict(full))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out
