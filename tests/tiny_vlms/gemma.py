"""Tiny random-weight builders for Gemma 4 and its encoder-free "unified" variant, and why Gemma 3n cannot
be tiny. Each builder writes one model directory (config, random weights, processor files, tokenizer)
that mlx-vlm itself loads and generates from with images; nothing outside it.

Each keeps hidden sizes <= 64 and 2 layers; Gemma 4 takes at most 4 image tokens a picture, while
mlx-vlm fixes gemma4_unified's image geometry (up to 280)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, ids, save_model, save_named_tokenizer, write_json

# --- gemma4: a patch ViT with 2D RoPE and position-pooling; per-layer token inputs in the LM ---


def build_gemma4(out: Path, seed: int) -> Path:
    named = {"image_token": "<|image|>", "boi_token": "<|boi|>", "eoi_token": "<|eoi|>"}
    tokenizer = save_named_tokenizer(out, named, chat_template("<|image|>"), ("<|video|>", "<|audio|>"))
    image, boi, eoi, video, audio = ids(tokenizer, *named.values(), "<|video|>", "<|audio|>")
    vocab_size = len(tokenizer)
    config = {
        "model_type": "gemma4",
        "vocab_size": vocab_size,
        "image_token_id": image,
        "video_token_id": video,
        "boi_token_id": boi,
        "eoi_token_id": eoi,
        "audio_token_id": audio,
        "hidden_size": 64,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "vision_soft_tokens_per_image": 4,
        "text_config": _gemma4_text(vocab_size),
        "vision_config": _gemma4_vision(),
        # The audio tower is built whatever the prompt holds: its defaults write 1.2 GB of weights.
        "audio_config": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "output_proj_dims": 32,
        },
    }
    # 8 px patches pooled 2x2: at most 4 soft tokens (a 32x32 px area) per image
    write_json(out, "processor_config.json", {"image_processor": _gemma4_images()})
    save_model(out, config, seed)
    return out


def _gemma4_text(vocab_size: int) -> dict:
    return {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "num_kv_shared_layers": 0,
        "vocab_size": vocab_size,
        "vocab_size_per_layer_input": vocab_size,
        "hidden_size_per_layer_input": 8,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
        "use_double_wide_mlp": False,
        "final_logit_softcapping": 30.0,
    }


def _gemma4_vision() -> dict:
    return {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "patch_size": 8,
        "position_embedding_size": 64,
        "pooling_kernel_size": 2,
        "default_output_length": 4,
    }


def _gemma4_images() -> dict:
    return {
        "patch_size": 8,
        "max_soft_tokens": 4,
        "pooling_kernel_size": 2,
        "do_normalize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
    }


# --- gemma4_unified: encoder-free vision (16 px patches linearly embedded), the Gemma 4 LM ---


def build_gemma4_unified(out: Path, seed: int) -> Path:
    named = {"image_token": "<|image|>", "boi_token": "<|boi|>", "eoi_token": "<|eoi|>"}
    extra = ("<|video|>", "<|audio|>", "<|boa|>", "<|eoa|>")
    tokenizer = save_named_tokenizer(out, named, chat_template("<|image|>"), extra)
    image, boi, eoi, video, audio, boa, eoa = ids(tokenizer, *named.values(), *extra)
    text = {
        **_gemma4_text(len(tokenizer)),
        "model_type": "gemma4_unified_text",
        "hidden_size_per_layer_input": 0,
    }
    config = {
        "model_type": "gemma4_unified",
        "vocab_size": len(tokenizer),
        "image_token_id": image,
        "video_token_id": video,
        "audio_token_id": audio,
        "boi_token_id": boi,
        "eoi_token_id": eoi,
        "boa_token_id": boa,
        "eoa_token_index": eoa,
        "hidden_size": 64,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": {**text, "num_global_key_value_heads": 1, "attention_k_eq_v": True},
        "vision_config": _gemma4_unified_vision(),
        "audio_config": {"hidden_size": 32, "audio_embed_dim": 32, "output_proj_dims": 32},
    }
    save_model(out, config, seed)
    return out


def _gemma4_unified_vision() -> dict:
    # mlx-vlm's load() replaces the processor's image processor by a default-built one, so images
    # are always cut into 48 px model patches, up to 280 per image (the 48x40 test picture: 270).
    return {
        "model_type": "gemma4_unified_vision",
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "model_patch_size": 48,
        "mm_embed_dim": 32,
        "mm_posemb_size": 1120,
        "num_soft_tokens": 280,
        "output_proj_dims": 32,
    }


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "gemma4": build_gemma4,
    "gemma4_unified": build_gemma4_unified,
}

NOT_BUILDABLE: dict[str, str] = {
    "gemma3n": (
        "vision tower is a hard-coded MobileNetV5-300M (gemma3n_mobilenet_def: stages up to 1280 "
        "channels, msfa out_chs 2048, about 300M parameters) that no config key shrinks"
    ),
}
