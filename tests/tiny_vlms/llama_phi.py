"""Tiny random-weight builders for Meta's Llama 4 and Mllama (Llama 3.2 Vision) and Microsoft's Phi-4-MM,
and why Phi-3-Vision and Phi-4 SigLIP cannot be built here. Each builder writes one model directory
(config, random weights, processor files, tokenizer) that mlx-vlm itself loads and generates from with
images; nothing outside it.

Each keeps hidden sizes <= 64, 2 layers and a handful of image tokens per picture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import (
    chat_template,
    ids,
    save_model,
    save_named_tokenizer,
    save_tokenizer,
    write_json,
)
from tests.tiny_vlms.parts import CLIP_MEAN, CLIP_STD, HALF, llama_text, vit
from tests.tiny_vlms.weights import set_weights

# --- llama4: 56 px tiles of 14 px patches, pixel shuffle 0.5, a MoE LM with chunked attention ---

LLAMA4_TOKENS = [
    "<|image|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|patch|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
]


def build_llama4(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, LLAMA4_TOKENS, chat_template("<|image|>"))
    config = {
        "model_type": "llama4",
        "image_token_id": ids(tokenizer, "<|patch|>")[0],
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": _llama4_text(len(tokenizer)),
        "vision_config": _llama4_vision(),
    }
    # One 56 px tile per image (max_patches 1): 16 patches shuffled into 4 <|patch|> tokens.
    images = {"size": {"height": 56, "width": 56}, "max_patches": 1, "image_mean": HALF, "image_std": HALF}
    write_json(out, "preprocessor_config.json", images)
    save_model(out, config, seed)
    return out


def _llama4_text(vocab_size: int) -> dict:
    return {
        **llama_text(vocab_size, "llama4_text"),
        "intermediate_size": 64,
        "intermediate_size_mlp": 128,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,  # layer 1 is the MoE layer
        "attention_chunk_size": 8192,
        "use_qk_norm": True,
    }


def _llama4_vision() -> dict:
    # the pixel-shuffle MLP reads hidden_size * 4 = intermediate_size features per token
    return {
        "model_type": "llama4_vision_model",
        "hidden_size": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 56,
        "patch_size": 14,
        "num_channels": 3,
        "norm_eps": 1e-5,
        "initializer_range": 0.02,
        "pixel_shuffle_ratio": 0.5,
        "projector_dropout": 0.0,
        "projector_input_dim": 64,
        "projector_output_dim": 64,
        "vision_output_dim": 64,
        "rope_theta": 10000.0,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
    }


# --- mllama: tiled ViT (local + global layers) read by cross-attention layers of the LM ---


def build_mllama(out: Path, seed: int) -> Path:
    tokenizer = save_named_tokenizer(out, {"image_token": "<|image|>"}, chat_template("<|image|>"))
    text = {**llama_text(len(tokenizer), "mllama"), "cross_attention_layers": [1]}
    config = {
        "model_type": "mllama",
        "image_token_index": ids(tokenizer, "<|image|>")[0],
        "vocab_size": len(tokenizer),
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": text,
        "vision_config": _mllama_vision(),
    }
    images = {
        "image_processor_type": "MllamaImageProcessor",
        "size": {"height": 28, "width": 28},
        "max_image_tiles": 4,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "do_pad": True,
        "do_convert_rgb": True,
        "resample": 2,
    }
    write_json(out, "preprocessor_config.json", images)
    save_model(out, config, seed)
    set_weights(out, 1.0, ("gate", "gate_attn", "gate_ffn"))  # zero-initialized tanh gates
    return out


def _mllama_vision() -> dict:
    # the projector reads the last layer plus each intermediate layer: 32 * (1 + 2) features
    return {
        **vit("mllama_vision_model", image_size=28),
        "max_num_tiles": 4,
        "num_global_layers": 1,
        "intermediate_layers_indices": [0, 1],
        "vision_output_dim": 96,
        "norm_eps": 1e-5,
    }


# --- phi4mm: NaFlex SigLIP2 over 8 px patches spliced at id -200, a Phi-4 LM, a (tiny) audio tower ---

PHI4MM_AUDIO = {
    "attention_dim": 32,
    "attention_heads": 2,
    "num_blocks": 1,
    "linear_units": 64,
    "ext_pw_out_channel": 32,
    "depthwise_seperable_out_channel": 32,
    "conv_channels": 32,
    "t5_bias_max_distance": 50,
}


def build_phi4mm(out: Path, seed: int) -> Path:
    """The prompt's "<image>" becomes the single id -200, replaced by one feature per patch
    (at most 16: a 32x32 px area of 8 px patches)."""
    tokenizer = save_tokenizer(out, ["<image>", "<|endoftext11|>"], chat_template("<image>"))
    text = llama_text(len(tokenizer), "phi4mm")
    vision = vit("siglip2_vision_model", image_size=32, patch_size=8)
    config = {
        **{key: value for key, value in text.items() if key not in ("head_dim", "model_type")},
        "model_type": "phi4mm",
        "partial_rotary_factor": 0.75,
        "mm_hidden_size": 32,
        "max_num_patches": 16,
        "min_num_patches": 4,
        "audio_token_index": ids(tokenizer, "<|endoftext11|>")[0],
        "pad_token_id": tokenizer.pad_token_id or 0,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "audio_processor": {"config": PHI4MM_AUDIO},
        "vision_config": {key: value for key, value in vision.items() if key != "projection_dim"},
    }
    save_model(out, config, seed)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "llama4": build_llama4,
    "mllama": build_mllama,
    "phi4mm": build_phi4mm,
}

NOT_BUILDABLE: dict[str, str] = {
    "phi3_v": (
        "vision tower is hard-coded CLIP ViT-L/14-336 (CLIP_VIT_LARGE_PATCH14_336_CONFIG: 24 layers "
        "x 1024, about 300M parameters, image_dim_out 1024) and the processor hard-codes 336 px tiles "
        "of 144 tokens; the config's vision_config is ignored"
    ),
    "phi4_siglip": (
        "Phi4SigLipProcessor cannot be built here: with a 'naflex' mm_vision_tower it imports "
        "transformers' torch-backed Siglip2ImageProcessor (No module named 'torch'), then falls back "
        "to AutoProcessor.from_pretrained, which the mlx-vlm patch sends back to itself (recursion "
        "reloading the tokenizer; no return in 300 s); without 'naflex' its SigLIP processor gives "
        "(N, 3, H, W) pixels that the NaFlex linear patch embedding rejects ([addmm] Last dimension "
        "of first input with shape (1,3,32,32) must match ... (192,32)); it also lacks apply_chat_template"
    ),
}
