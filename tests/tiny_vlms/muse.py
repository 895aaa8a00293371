"""Tiny random-weight builders for Muse Glimmer and Muse Spark (a windowed ViT with 2x2 pixel shuffle,
sliding-window / global language models), and why Muse Spark cannot run here. Each builder writes one
model directory (config, random weights, processor files, tokenizer) that mlx-vlm itself loads and
generates from with images; nothing outside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json

# --- Muse Glimmer: a windowed ViT with 2x2 pixel shuffle, an MLP adapter, a sliding/global LM ------------

MUSE_TOKENS = ["<|patch|>", "<|image_start|>", "<|image_end|>", "<|video|>"]


def build_muse_glimmer(out: Path, seed: int) -> Path:
    """A budget of 4 merged tokens resizes a 48x40 picture to 56x56 px: 4x4 patches of 14 px (2 frames),
    shuffled 2x2 into 4 image tokens."""
    tokenizer = save_tokenizer(out, MUSE_TOKENS, chat_template("<|patch|>"))
    ids = token_ids(tokenizer, MUSE_TOKENS)
    vision = {"patch_size": 14, "patch_temporal": 2, "merge_size": 2, "pos_emb_height": 8}
    vision |= {"pos_emb_width": 8, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    vision |= {"num_hidden_layers": 2}
    text = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128}
    text |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    text |= {"sliding_window": 64, "bos_token_id": tokenizer.bos_token_id}
    text["eos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = {"model_type": "muse_glimmer", "text_config": text, "vision_config": vision}
    config |= {"image_token_id": ids["<|patch|>"], "video_token_id": ids["<|video|>"]}
    config |= {"out_hidden_size": 128, "projector_hidden_size": 64}  # 2x2 merged 32-wide patches
    save_model(out, config, seed)
    image = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "max_image_tokens": 4}
    write_json(out, "processor_config.json", {"image_processor": image})
    return out


# --- Muse Spark: Muse Glimmer's tower, an all-MoE LM with a compressed expert space ------------------------

MUSE_SPARK_TOKENS = [*MUSE_TOKENS, "<|audio|>", "<|eom|>"]


def build_muse_spark(out: Path, seed: int) -> Path:
    """Not in BUILDERS (see NOT_BUILDABLE): its attention needs Metal kernels. A budget of 4 image
    tokens (28 px each) resizes a 48x40 picture to 56x56 px: 4x4 patches of 14 px shuffled 2x2 into 4
    tokens. Both LM layers are MoE (4 experts, 2 a token)."""
    tokenizer = save_tokenizer(out, MUSE_SPARK_TOKENS, chat_template("<|patch|>"))
    ids = token_ids(tokenizer, MUSE_SPARK_TOKENS)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    vision |= {"patch_size": 14, "patch_temporal": 2, "merge_size": 2, "pos_emb_height": 8}
    vision |= {"pos_emb_width": 8, "rope_parameters": {"rope_theta": 10000.0}}
    config = {"model_type": "muse_spark", "text_config": _muse_spark_text(len(tokenizer))}
    config |= {"vision_config": vision, "image_token_id": ids["<|patch|>"]}
    config |= {"audio_token_id": ids["<|audio|>"], "video_token_id": ids["<|video|>"]}
    # transformers' own MuseSpark config (read by AutoTokenizer) requires an audio tower that writes
    # the LM width; a one-stage one
    audio = {"patch_sizes": [4], "hidden_sizes": [16], "depths": [1], "num_hidden_layers": 1}
    config["audio_config"] = audio | {"out_hidden_size": 64}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    write_json(out, "processor_config.json", {"image_processor": {"max_image_tokens": 4}})
    return out


def _muse_spark_text(vocab_size: int) -> dict:
    """A sliding-window layer with RoPE, then a global layer without (theta 0)."""
    return {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "post_norm_eps": 1e-8,
        "rope_parameters": {"rope_theta": 10000.0},
        "layer_rope_theta": [10000.0, 0],
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 64,
        "final_logit_softcapping": 20.0,
        "output_multiplier": 1.0,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "moe_hidden_size": 32,
        "moe_intermediate_size": 32,
    }


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "muse_glimmer": build_muse_glimmer,
}

NOT_BUILDABLE: dict[str, str] = {
    "muse_spark": "its attention calls Metal-only kernels (mx.fast.metal_kernel qk_norm_rope): "
    "RuntimeError: [metal_kernel] No Metal back-end on this Linux CPU (build_muse_spark builds it)",
}
