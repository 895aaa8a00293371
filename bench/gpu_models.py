"""The models bench/gpu.py measures: Llama shapes with random weights, written as mlx-lm directories tensor by
tensor, and the bytes and parameters their rooflines count; also the engine settings a GPU bench takes as
`key=value` words (bench/gpu.py, bench/stress.py). Owns only the directories; measuring is gpu.py's.

A shape is `1b` (Llama-3.2-1B's config, tied embeddings) or `8b` (Llama-3.1-8B's, untied), optionally with
`-4bit`: every Linear and Embedding whose input width 64 divides quantized as mlx-lm quantizes (affine, group
size 64, 4 bits; `mlx_lm.utils.quantize_model`), from the same bf16 weights the plain shape gets.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama

LLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
}
LLAMA_8B = {
    **LLAMA_1B,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "head_dim": 128,
    "rope_scaling": {**LLAMA_1B["rope_scaling"], "factor": 8.0},
    "tie_word_embeddings": False,
}
BASE_SHAPES = {"1b": LLAMA_1B, "8b": LLAMA_8B}
# --tiny: the same structure (tied or not, rope scaling) at a size a CPU runs in seconds.
TINY_SIZES = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
GROUP_SIZE, BITS = 64, 4
SHARD_BYTES = 2 << 30  # what one shard holds on the device while it is built and written


@dataclass
class Shape:
    name: str  # as given on the command line: 1b, 8b, 8b-4bit
    config: dict
    bits: int | None  # None: bf16 weights


@dataclass
class BuiltModel:
    """What the rooflines count. `step_bytes`: bytes a decode step reads, every stored tensor once (packed
    weights, scales and biases as stored) except an untied input embedding table, of which a step reads
    only its batch's rows (left out: a few KB). A tied table is counted once: the output head reads all of it.
    `matmul_params`: logical parameters outside the embedding table and output head, whose 2 FLOPs per
    token each bound prefill (the head runs on the last token only; attention's own FLOPs are left out)."""

    path: Path
    num_params: int
    weight_bytes: int
    step_bytes: int
    matmul_params: int
    build_s: float


def parse_shapes(spec: str, tiny: bool) -> list[Shape]:
    shapes = []
    for name in spec.split(","):
        base, _, suffix = name.strip().partition("-")
        if base not in BASE_SHAPES or suffix not in ("", f"{BITS}bit"):
            raise SystemExit(f"unknown shape {name!r}: use 1b or 8b, optionally with -{BITS}bit")
        config = {**BASE_SHAPES[base], **(TINY_SIZES if tiny else {})}
        if suffix:
            config["quantization"] = {"group_size": GROUP_SIZE, "bits": BITS, "mode": "affine"}
            config["quantization_config"] = config["quantization"]  # as mlx-lm writes it
        shapes.append(Shape(name.strip(), config, BITS if suffix else None))
    return shapes


def build_model_dir(path: Path, shape: Shape, seed: int = 0) -> BuiltModel:
    """Writes config, random weights (mlx-lm's initialisers, cast to bf16, quantized where the shape
    says) in shards of about SHARD_BYTES, and a word-level tokenizer ("t0".."t<vocab-1>")."""
    t0 = time.perf_counter()
    config = shape.config
    plain = {k: v for k, v in config.items() if not k.startswith("quantization")}
    model = llama.Model(llama.ModelArgs.from_dict(plain))  # lazy: only its shapes and layer kinds are read
    quantized = _quantized_layers(model) if shape.bits else set()
    shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
    del model
    counts = {"num_params": 0, "weight_bytes": 0, "step_bytes": 0, "matmul_params": 0}
    shard: dict[str, mx.array] = {}
    num_shards = 0
    for index, (name, dims) in enumerate(shapes.items()):
        tensors = _tensors(name, dims, seed * 1_000_003 + index, name.rpartition(".")[0] in quantized)
        mx.eval(tensors)
        shard.update(tensors)
        _count(counts, name, dims, tensors, config["tie_word_embeddings"])
        if sum(v.nbytes for v in shard.values()) >= SHARD_BYTES:
            _save_shard(path, shard, num_shards)
            shard, num_shards = {}, num_shards + 1
    if shard:
        _save_shard(path, shard, num_shards)
    (path / "config.json").write_text(json.dumps(config))
    _write_tokenizer(path, config["vocab_size"])
    return BuiltModel(path, **counts, build_s=time.perf_counter() - t0)


def _quantized_layers(model: nn.Module) -> set[str]:
    """The layers `mlx_lm.utils.quantize_model` quantizes: those with `to_quantized` whose input width
    the group size divides."""
    return {
        path
        for path, module in model.named_modules()
        if hasattr(module, "to_quantized") and module.weight.shape[-1] % GROUP_SIZE == 0
    }


def _tensors(name: str, dims: tuple, seed: int, quantize: bool) -> dict[str, mx.array]:
    """One parameter as mlx-lm initialises it (nn.Linear: uniform within 1/sqrt(in); nn.Embedding:
    normal with scale 1/sqrt(dims); norms: ones), in bf16; quantized, its weight, scales and biases."""
    key = mx.random.key(seed)
    if "norm" in name:
        weight = mx.ones(dims, dtype=mx.bfloat16)
    elif "embed_tokens" in name:
        weight = mx.random.normal(dims, scale=math.sqrt(1 / dims[-1]), key=key).astype(mx.bfloat16)
    else:
        scale = math.sqrt(1 / dims[-1])
        weight = mx.random.uniform(-scale, scale, dims, key=key).astype(mx.bfloat16)
    if not quantize:
        return {name: weight}
    packed, scales, biases = mx.quantize(weight, GROUP_SIZE, BITS, mode="affine")
    base = name.removesuffix(".weight")
    return {name: packed, f"{base}.scales": scales, f"{base}.biases": biases}


def _count(counts: dict, name: str, dims: tuple, tensors: dict, tied: bool) -> None:
    size, nbytes = math.prod(dims), sum(v.nbytes for v in tensors.values())
    counts["num_params"] += size
    counts["weight_bytes"] += nbytes
    is_embed = "embed_tokens" in name
    counts["step_bytes"] += 0 if is_embed and not tied else nbytes
    counts["matmul_params"] += 0 if is_embed or name.startswith("lm_head") else size


def _save_shard(path: Path, shard: dict[str, mx.array], index: int) -> None:
    # mlx-lm's load and the engine's both read every model*.safetensors in the directory.
    mx.save_safetensors(str(path / f"model-{index:05d}.safetensors"), shard, metadata={"format": "mlx"})


def _write_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t0", "eos_token": "t1"}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))


def parse_overrides(items: list[str], flag: str) -> dict:
    """EngineConfig fields from `key=value` words, each value read as JSON where it parses."""
    overrides: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(
                f"{flag} takes key=value (an EngineConfig field, e.g. max_num_seqs=128), got {item!r}"
            )
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides
