"""Tiny random-weight builders for vision models on Mamba + attention language models: Nemotron-3 Nano Omni
(Nemotron-H) and PLaMo 2 VL. Each builder writes one model directory (config, random weights, processor
files, tokenizer) that mlx-vlm itself loads and generates from with images; nothing outside it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json

# --- Nemotron-3 Nano Omni: a RADIO ViT, 2x2 pixel shuffle, a Nemotron-H (Mamba2 + attention) LM ----------

NEMOTRON_OMNI_TOKENS = ["<image>", "<img>", "</img>", "<video>", "<so_embedding>", "<so_start>", "<so_end>"]


def build_nemotron_h_nano_omni(out: Path, seed: int) -> Path:
    """A patch budget of 16 resizes a 48x40 picture to 64x64 px: 4x4 patches of 16 px, pixel-shuffled
    into 4 image tokens between <img> and </img>. No sound encoder."""
    tokenizer = save_tokenizer(out, NEMOTRON_OMNI_TOKENS, chat_template("<image>"))
    ids = token_ids(tokenizer, NEMOTRON_OMNI_TOKENS)
    vision = {"model_type": "radio", "args": {}, "hidden_size": 32, "num_hidden_layers": 1}
    vision |= {"num_attention_heads": 2, "intermediate_size": 64, "image_size": 64, "patch_size": 16}
    vision |= {"max_resolution": 64}
    config = {"model_type": "nemotron_h_nano_omni", "text_config": _nemotron_h_text(len(tokenizer))}
    config |= {"vision_config": vision, "downsample_ratio": 0.5, "projector_hidden_size": 64}
    config |= {"vit_hidden_size": 32, "img_context_token_id": ids["<image>"]}
    config |= {"video_context_token_id": ids["<video>"], "sound_context_token_id": ids["<so_embedding>"]}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    preprocessor = {"patch_size": 16, "downsample_ratio": 0.5, "min_num_patches": 4, "norm_mean": [0.5] * 3}
    write_json(out, "preprocessor_config.json", preprocessor | {"max_num_patches": 16, "norm_std": [0.5] * 3})
    return out


def _nemotron_h_text(vocab_size: int) -> dict:
    """One Mamba2 layer, then one attention layer."""
    return {
        "model_type": "nemotron_h",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "hybrid_override_pattern": "M*",
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
    }


# --- PLaMo 2 VL: SigLIP over 28 px Eagle2 tiles, an MLP projector, a PLaMo 2 (Mamba + attention) LM -------

PLAMO_SPECIAL = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:pad|>", "<|plamo:eos|>"]
PLAMO_IMAGE_TOKENS = ["<plamo:image>", "<siglip2:img>", "</siglip2:img>"]


def build_plamo2vl(out: Path, seed: int) -> Path:
    """PLaMo's processor needs its own tokenizer.jsonl (no bundled-tokenizer option): a small synthetic
    one with byte fallback, printable ASCII and the image markers. A 16-token tile budget keeps one 28 px
    tile of 2x2 patches (14 px): 4 image tokens. The processor writes its own instruction template."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = _write_plamo_tokenizer(out)
    ids = {token: vocab.index(token) for token in PLAMO_SPECIAL + PLAMO_IMAGE_TOKENS}
    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    text |= {"hidden_size_per_head": 16, "attention_window_size": 64, "mamba_d_state": 16}
    text |= {"mamba_num_heads": 4, "mamba_step": 2, "mamba_chunk_size": 16, "intermediate_size": 128}
    text |= {"vocab_size": len(vocab), "tie_word_embeddings": False}
    vision = {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64, "num_attention_heads": 2}
    vision |= {"patch_size": 14, "image_size": 28, "image_token_id": ids["<plamo:image>"]}
    vision |= {"image_feature_size": 32, "image_proj_hidden_size": 64}
    config = {"model_type": "plamo2vl", "text_config": text, "vision_config": vision}
    config |= {"image_token_index": ids["<plamo:image>"], "eos_token_id": [ids["<|plamo:eos|>"]]}
    save_model(out, config, seed)
    write_json(out, "preprocessor_config.json", _plamo_image_processor())
    return out


def _write_plamo_tokenizer(out: Path) -> list[str]:
    """tokenizer.jsonl rows are [piece, score, kind]; every byte needs a BYTE row."""
    rows = [[token, 0.0, "CONTROL"] for token in PLAMO_SPECIAL + PLAMO_IMAGE_TOKENS]
    rows += [[f"<0x{i:02X}>", 0.0, "BYTE"] for i in range(256)]
    rows += [[chr(c), -1.0, "NORMAL"] for c in range(32, 127)]
    (out / "tokenizer.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    special = {"unk_token": PLAMO_SPECIAL[0], "bos_token": PLAMO_SPECIAL[1]}
    special |= {"pad_token": PLAMO_SPECIAL[2], "eos_token": PLAMO_SPECIAL[3]}
    tokenizer_config = special | {"additional_special_tokens": PLAMO_IMAGE_TOKENS}
    write_json(out, "tokenizer_config.json", tokenizer_config | {"tokenizer_class": "Plamo2Tokenizer"})
    return [row[0] for row in rows]


def _plamo_image_processor() -> dict:
    return {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": 28, "width": 28},
        "patch_size": 14,
        "max_image_width": 28,
        "max_image_height": 28,
        "downsample_ratio": 1.0,
        "tile_context_length": 16,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "nemotron_h_nano_omni": build_nemotron_h_nano_omni,
    "plamo2vl": build_plamo2vl,
}

NOT_BUILDABLE: dict[str, str] = {}
