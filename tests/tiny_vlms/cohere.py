"""Tiny random-weight builders for Cohere's vision models: Aya Vision and Cohere Compass. Each builder
writes one model directory (config, random weights, processor files, tokenizer) that mlx-vlm itself
loads and generates from with images; nothing outside it.

Each keeps hidden sizes <= 64, 2 layers and a handful of image tokens per picture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, ids, save_model, save_tokenizer, write_json
from tests.tiny_vlms.parts import HALF, llama_text, vit

# --- aya_vision: SigLIP 56 px tiles, pixel shuffle 2, a SwiGLU adapter into a Cohere2 LM ---

AYA_TOKENS = [
    "<image>",
    "<|START_OF_IMG|>",
    "<|END_OF_IMG|>",
    "<|IMG_PATCH|>",
    "<|IMG_LINE_BREAK|>",
    "TILE",
    "TILE_GLOBAL",
]


def build_aya_vision(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, AYA_TOKENS, chat_template("<image>"))
    text = {
        **llama_text(len(tokenizer), "cohere2"),
        "layer_norm_eps": 1e-5,
        "logit_scale": 0.0625,
        "sliding_window": 16,
        "sliding_window_pattern": 2,
    }
    config = {
        "model_type": "aya_vision",
        "image_token_index": ids(tokenizer, "<|IMG_PATCH|>")[0],
        "downsample_factor": 2,
        "alignment_intermediate_size": 128,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": text,
        "vision_config": vit("siglip_vision_model", image_size=56, layer_norm_eps=1e-6),
    }
    # One 56 px tile per image: 16 patches shuffled into 4 <|IMG_PATCH|> tokens.
    images = {
        "image_processor_type": "GotOcr2ImageProcessor",
        "size": {"height": 56, "width": 56},
        "crop_to_patches": False,
        "min_patches": 1,
        "max_patches": 1,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": HALF,
        "image_std": HALF,
        "do_convert_rgb": True,
    }
    write_json(out, "preprocessor_config.json", images)
    processor = {
        "processor_class": "AyaVisionProcessor",
        "patch_size": 14,
        "img_size": 56,
        "downsample_factor": 2,
    }
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


# --- cohere_compass: a Qwen3-VL-style packed ViT (deepstack, M-RoPE) into a parallel-block LM ---

COMPASS_TOKENS = ["<|VISION_START|>", "<|IMAGE_PAD|>", "<|VISION_END|>"]


def build_cohere_compass(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, COMPASS_TOKENS, chat_template("".join(COMPASS_TOKENS)))
    start, pad, end = ids(tokenizer, *COMPASS_TOKENS)
    text = {
        **llama_text(len(tokenizer), "cohere_compass_text"),
        "layer_types": ["full_attention", "full_attention"],
        # per layer type (transformers validates this config too); sections are halves of head_dim 16
        "rope_parameters": {"full_attention": {"rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    }
    config = {
        "model_type": "cohere_compass",
        "image_token_id": pad,
        "vision_start_token_id": start,
        "vision_end_token_id": end,
        "min_pixels": 32 * 32,  # 8 px patches merged 2x2: 4 to 8 image tokens per picture
        "max_pixels": 32 * 64,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": text,
        "vision_config": _compass_vision(),
    }
    write_json(out, "preprocessor_config.json", {"image_mean": HALF, "image_std": HALF})
    save_model(out, config, seed)
    return out


def _compass_vision() -> dict:
    return {
        "model_type": "cohere_compass_vision",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 8,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0],
    }


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "aya_vision": build_aya_vision,
    "cohere_compass": build_cohere_compass,
}

NOT_BUILDABLE: dict[str, str] = {}
