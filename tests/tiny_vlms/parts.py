"""Tiny config pieces that several family modules share: image normalizations, a two-layer
Llama-style text config, a small ViT config and a two-layer hybrid Qwen3.5 language model."""

from __future__ import annotations

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]


# A two-layer hybrid Qwen3.5 language model: layer 0 gated-delta (linear), layer 1 full attention.
QWEN35_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "rope_parameters": {
        "type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1],  # halves of the 8 rotary dims
    },
    "tie_word_embeddings": False,
}


def llama_text(vocab_size: int, model_type: str = "llama") -> dict:
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }


def vit(model_type: str, image_size: int = 28, patch_size: int = 14, **extra) -> dict:
    return {
        "model_type": model_type,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": image_size,
        "patch_size": patch_size,
        "projection_dim": 32,
        "num_channels": 3,
        "layer_norm_eps": 1e-5,
        **extra,
    }
