"""Tiny random-weight builders for MiniCPM-V 4.6 / 4.7 (on a Qwen3.5 language model) and MiniCPM-o. Each
builder writes one model directory (config, random weights, processor files, tokenizer) that mlx-vlm
itself loads and generates from with images; nothing outside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json
from tests.tiny_vlms.parts import QWEN35_TEXT

SIGLIP_TINY = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "patch_size": 14,
}


# --- MiniCPM-V 4.6: SigLIP tower, a windowed merger inside it, a 2x2 merger, Qwen3.5 LM ---------------

MINICPM_TOKENS = [
    "<image>",
    "</image>",
    "<slice>",
    "</slice>",
    "<image_id>",
    "</image_id>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def build_minicpmv4_6(out: Path, seed: int, model_type: str = "minicpmv4_6") -> Path:
    """Images resize to 112x112 (no slices): 8x8 patches of 14 px, merged 16x into 4 image tokens."""
    tokenizer = save_tokenizer(out, MINICPM_TOKENS, chat_template("<image>./</image>"))
    config = {
        "model_type": model_type,
        **QWEN35_TEXT,
        "vocab_size": len(tokenizer),
        "vision_config": {**SIGLIP_TINY, "image_size": 112},
        "image_size": 112,
        "patch_size": 14,
        "insert_layer_id": 0,
        "slice_mode": False,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    if model_type == "minicpmv4_7":
        config |= _minicpm47_token_ids(tokenizer)
    save_model(out, config, seed)
    write_json(out, "preprocessor_config.json", _minicpm_image_processor(112))
    return out


def build_minicpmv4_7(out: Path, seed: int) -> Path:
    """MiniCPM-V 4.6's model and processor with "canvas" M-RoPE positions for the image tokens."""
    return build_minicpmv4_6(out, seed, "minicpmv4_7")


def _minicpm47_token_ids(tokenizer) -> dict:
    ids = token_ids(tokenizer, MINICPM_TOKENS)
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "image_start_id": ids["<image>"],
        "image_end_id": ids["</image>"],
        "slice_start_id": ids["<slice>"],
        "slice_end_id": ids["</slice>"],
        "newline_id": tokenizer.encode("\n", add_special_tokens=False)[0],
    }


def _minicpm_image_processor(scale_resolution: int) -> dict:
    return {
        "max_slice_nums": 1,
        "patch_size": 14,
        "scale_resolution": scale_resolution,
        "slice_mode": False,
        "use_image_id": True,
        "downsample_mode": "16x",
        "norm_mean": [0.5, 0.5, 0.5],
        "norm_std": [0.5, 0.5, 0.5],
    }


# --- MiniCPM-o: SigLIP tower, a query resampler, Qwen3 (M-RoPE) LM; the audio and TTS parts left out -----


def build_minicpmo(out: Path, seed: int) -> Path:
    """Images resize to 56x56: 4x4 patches of 14 px, resampled by 4 learned queries into 4 image tokens."""
    tokenizer = save_tokenizer(out, [*MINICPM_TOKENS, "<unk>"], chat_template("<image>./</image>"))
    config = {
        "model_type": "minicpmo",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "default", "mrope_section": [4, 2, 2]},  # halves of head_dim 16
        "vocab_size": len(tokenizer),
        "vision_config": {**SIGLIP_TINY, "image_size": 56},
        "query_num": 4,
        "image_size": 56,
        "patch_size": 14,
        "slice_mode": False,
        "init_audio": False,
        "init_tts": False,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    save_model(out, config, seed)
    image = {"patch_size": 14, "scale_resolution": 56, "image_feature_size": 4, "unk": "<unk>"}
    write_json(out, "preprocessor_config.json", {**image, "feature_size": 80, "sampling_rate": 16000})
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "minicpmv4_6": build_minicpmv4_6,
    "minicpmv4_7": build_minicpmv4_7,
    "minicpmo": build_minicpmo,
}

NOT_BUILDABLE: dict[str, str] = {}
