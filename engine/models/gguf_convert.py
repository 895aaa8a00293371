"""Converts a llama-architecture GGUF file into an mlx-lm model directory (config, weights, tokenizer).

Owns only the translation of GGUF names, layouts and metadata; it never decides where the output
lives or when it is rebuilt (that is engine/models/default_model.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

# GGUF stores Q4_0, Q4_1 and Q8_0 in blocks of 32 weights; MLX maps each block to one affine group.
_GGUF_GROUP_SIZE = 32

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

# tokenizer.ggml.token_type values (llama.cpp `llama_token_type`).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# tokenizer.ggml.pre -> whether digits are split one by one before the GPT-2 byte-level regex.
_PRE_TOKENIZERS = {"smollm": True, "gpt-2": False, "default": False}


def convert_gguf(
    gguf_path: Path, out_dir: Path, dtype: str, desc: str = "Converting GGUF", keep_quantized: bool = False
) -> None:
    """Writes config.json, generation_config.json, model.safetensors, tokenizer.json and
    tokenizer_config.json for `gguf_path` into the existing directory `out_dir`. `keep_quantized`
    keeps Q4_0/Q4_1/Q8_0 tensors as MLX's affine codes (groups of 32) instead of dequantizing them;
    scales and biases are then stored in `dtype`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}; pick one of those")
    loaded: Any = mx.load(str(gguf_path), return_metadata=True)  # MLX's stub types it as one union
    raw: dict[str, mx.array] = loaded[0]
    meta: dict[str, Any] = loaded[1]
    config = build_config(meta, has_output="output.weight" in raw)
    bases = sorted({name.rsplit(".", 1)[0] for name in raw})
    if keep_quantized:
        config["quantization"] = _quantization(raw, bases)
    weights: dict[str, mx.array] = {}
    with tqdm(total=len(bases) + 2, desc=desc, unit="tensor") as bar:
        for base in bases:
            for name, value in _convert_tensor(raw, base, config, DTYPES[dtype], keep_quantized):
                weights[name] = value
            bar.update()
        bar.set_postfix_str("tokenizer")
        _write_tokenizer(meta, out_dir, config["max_position_embeddings"])
        bar.update()
        bar.set_postfix_str("saving")
        mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
        _write_json(out_dir / "config.json", config)
        _write_json(out_dir / "generation_config.json", _generation_config(config))
        bar.update()


def build_config(meta: dict[str, Any], has_output: bool) -> dict[str, Any]:
    """An mlx-lm / Hugging Face llama config.json from the GGUF `llama.*` metadata."""
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported; only 'llama' converts")
    num_heads = _int(meta, "llama.attention.head_count")
    hidden_size = _int(meta, "llama.embedding_length")
    head_dim = hidden_size // num_heads
    rope_dims = meta.get("llama.rope.dimension_count")
    assert rope_dims is None or int(rope_dims.item()) == head_dim, "partial RoPE is not a llama layout"
    vocab_size = meta.get("llama.vocab_size")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "num_hidden_layers": _int(meta, "llama.block_count"),
        "intermediate_size": _int(meta, "llama.feed_forward_length"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _int(meta, "llama.attention.head_count_kv"),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"].item()),
        "rope_theta": float(meta["llama.rope.freq_base"].item()),
        "max_position_embeddings": _int(meta, "llama.context_length"),
        "vocab_size": int(vocab_size.item())
        if vocab_size is not None
        else len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": not has_output,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": _int(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _int(meta, "tokenizer.ggml.eos_token_id"),
    }


def _int(meta: dict[str, Any], key: str) -> int:
    return int(meta[key].item())


def _convert_tensor(
    raw: dict[str, mx.array], base: str, config: dict[str, Any], dtype: mx.Dtype, keep_quantized: bool
) -> Iterator[tuple[str, mx.array]]:
    """The mlx-lm tensors of one GGUF tensor: its weight, and its scales and biases where it stays
    quantized. Rows of q and k (codes, scales and biases alike) go back to the half-split layout."""
    parts = {"weight": _dequantize(raw, base).astype(dtype)}
    if keep_quantized and base + ".scales" in raw:
        parts = {"weight": raw[base + ".weight"]}
        parts |= {kind: raw[f"{base}.{kind}"].astype(dtype) for kind in ("scales", "biases")}
    heads = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(base.split(".")[-1])
    for kind, value in parts.items():
        if heads is not None:
            value = unpermute_rope_rows(value, config[heads])
        mx.eval(value)  # one tensor at a time keeps the progress bar honest and peak memory low
        yield f"{mlx_name(base)}.{kind}", value


def _quantization(raw: dict[str, mx.array], bases: list[str]) -> dict[str, Any]:
    """mlx-lm's `quantization` config: the most common bit width for the model, and an entry of its
    own for each module of another width (the Q4_1 file keeps token_embd in Q8_0)."""
    widths = {base: _bits(raw, base) for base in bases if base + ".scales" in raw}
    common = Counter(widths.values()).most_common(1)[0][0]
    config: dict[str, Any] = {"group_size": _GGUF_GROUP_SIZE, "bits": common}
    for base, bits in widths.items():
        if bits != common:
            config[mlx_name(base)] = {"group_size": _GGUF_GROUP_SIZE, "bits": bits}
    return config


def _bits(raw: dict[str, mx.array], base: str) -> int:
    return raw[base + ".weight"].shape[-1] * 32 // (raw[base + ".scales"].shape[-1] * _GGUF_GROUP_SIZE)


def _dequantize(raw: dict[str, mx.array], base: str) -> mx.array:
    weight = raw[base + ".weight"]
    scales = raw.get(base + ".scales")
    if scales is None:
        return weight
    bits = _bits(raw, base)
    # float32 scales and biases reproduce llama.cpp's dequantization exactly; float16 ones round.
    return mx.dequantize(
        weight,
        scales.astype(mx.float32),
        raw[base + ".biases"].astype(mx.float32),
        group_size=_GGUF_GROUP_SIZE,
        bits=bits,
    )


def mlx_name(base: str) -> str:
    """GGUF tensor base name ("blk.3.attn_q") -> mlx-lm llama module path ("model.layers.3.self_attn.q_proj")."""
    if base in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[base]
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ValueError(
        f"GGUF tensor {base!r} has no llama equivalent; this converter supports plain llama only"
    )


def unpermute_rope_rows(weight: mx.array, num_heads: int) -> mx.array:
    """Undoes convert_hf_to_gguf's row permutation of attn_q/attn_k.

    llama.cpp interleaves each head's rotary halves (rows i and i + head_dim/2 become 2i and 2i+1)
    for its GPT-J style RoPE; mlx-lm's llama uses the Hugging Face half-split layout.
    """
    out_dim, in_dim = weight.shape
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, half, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def _write_tokenizer(meta: dict[str, Any], out_dir: Path, max_len: int) -> None:
    tokenizer = build_tokenizer(meta)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        return tokens[_int(meta, key)] if key in meta else None

    _write_json(
        out_dir / "tokenizer_config.json",
        {
            # The generic fast class loads tokenizer.json as is; GPT2Tokenizer would rebuild the
            # pre-tokenizer and lose the digit splitting.
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": token("tokenizer.ggml.bos_token_id"),
            "eos_token": token("tokenizer.ggml.eos_token_id"),
            "unk_token": token("tokenizer.ggml.unknown_token_id"),
            "pad_token": token("tokenizer.ggml.padding_token_id"),
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_len,
            "chat_template": meta.get("tokenizer.chat_template"),
        },
    )


def build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from the GGUF vocabulary, merges and token types."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"tokenizer model {meta.get('tokenizer.ggml.model')!r} is not supported; only 'gpt2'"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not supported; known: {sorted(_PRE_TOKENIZERS)}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    # Byte-level BPE symbols never contain a space (it is 'Ġ'), so one split per merge is exact.
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tokenizer = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    steps = (
        [pre_tokenizers.Digits(individual_digits=True), byte_level] if _PRE_TOKENIZERS[pre] else [byte_level]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    _add_typed_tokens(tokenizer, tokens, meta["tokenizer.ggml.token_type"].tolist())
    return tokenizer


def _add_typed_tokens(tokenizer: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    # Control tokens (<|im_start|> ...) are special: matched whole before BPE and skippable on decode.
    special = [tok for tok, kind in zip(tokens, token_types) if kind == _TOKEN_CONTROL]
    user = [tok for tok, kind in zip(tokens, token_types) if kind == _TOKEN_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in special])
    tokenizer.add_tokens([AddedToken(tok, special=False, normalized=False) for tok in user])


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    return {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
