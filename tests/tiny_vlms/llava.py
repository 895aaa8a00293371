"""Tiny random-weight builders for the LLaVA family: LLaVA-NeXT, LLaVA-OneVision, Granite Vision, Granite 4
Vision and Bunny, and why FastVLM cannot be tiny. Each builder writes one model directory (config,
random weights, processor files, tokenizer) that mlx-vlm itself loads and generates from with images;
nothing outside it.

Each keeps hidden sizes <= 64, 2 layers and a handful of image tokens per picture, except where mlx-vlm
fixes the image geometry (llava_bunny: 729 tokens)."""

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

# --- llava_next / llava_onevision: CLIP or SigLIP patches, anyres crops, a newline embedding ---


def anyres_images(image_processor_type: str, side: int, mean: list[float], std: list[float]) -> dict:
    """Crops of `side` px; an image becomes a base crop plus up to 2x2 tiles. LLaVA-NeXT resizes the
    shortest edge then center-crops; OneVision resizes to the square."""
    pinpoints = [[side * h, side * w] for h in (1, 2) for w in (1, 2)]
    is_next = image_processor_type == "LlavaNextImageProcessor"
    return {
        "image_processor_type": image_processor_type,
        "size": {"shortest_edge": side} if is_next else {"height": side, "width": side},
        "crop_size": {"height": side, "width": side},
        "image_grid_pinpoints": pinpoints,
        "do_resize": True,
        "do_center_crop": is_next,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": mean,
        "image_std": std,
        "do_pad": True,
        "do_convert_rgb": True,
        "resample": 3,
    }


def build_llava_next(out: Path, seed: int) -> Path:
    tokenizer = save_named_tokenizer(out, {"image_token": "<image>"}, chat_template("<image>"))
    config = {
        "model_type": "llava_next",
        "image_token_index": ids(tokenizer, "<image>")[0],
        "vocab_size": len(tokenizer),
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -1,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": llama_text(len(tokenizer)),
        "vision_config": vit("clip_vision_model"),
    }
    write_json(
        out, "preprocessor_config.json", anyres_images("LlavaNextImageProcessor", 28, CLIP_MEAN, CLIP_STD)
    )
    processor = {
        "processor_class": "LlavaNextProcessor",
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
    }
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


def build_llava_onevision(out: Path, seed: int) -> Path:
    named = {"image_token": "<image>", "video_token": "<video>"}
    tokenizer = save_named_tokenizer(out, named, chat_template("<image>"))
    images = anyres_images("LlavaOnevisionImageProcessor", 28, HALF, HALF)
    config = {
        "model_type": "llava_onevision",
        "image_token_index": ids(tokenizer, "<image>")[0],
        "video_token_index": ids(tokenizer, "<video>")[0],
        "vocab_size": len(tokenizer),
        "image_grid_pinpoints": images["image_grid_pinpoints"],
        "vision_aspect_ratio": "anyres_max_9",
        "vision_feature_select_strategy": "full",
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": llama_text(len(tokenizer), "qwen2"),
        "vision_config": vit("siglip_vision_model", layer_norm_eps=1e-6, vision_use_head=False),
    }
    write_json(out, "preprocessor_config.json", images)
    processor = {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": 4, **named}
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


# --- granite_vision: LLaVA-NeXT with SigLIP features of two layers and a Granite (muP) LM ---


def build_granite_vision(out: Path, seed: int) -> Path:
    tokenizer = save_named_tokenizer(out, {"image_token": "<image>"}, chat_template("<image>"))
    text = {
        **llama_text(len(tokenizer), "granite"),
        "tie_word_embeddings": True,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.0625,
        "residual_multiplier": 1.0,  # 0.22 (the real value) leaves the image too faint to change tokens
        "logits_scaling": 8.0,
    }
    images = anyres_images("LlavaNextImageProcessor", 28, HALF, HALF)
    config = {
        "model_type": "granite_vision",
        "image_token_index": ids(tokenizer, "<image>")[0],
        "vocab_size": len(tokenizer),
        "image_grid_pinpoints": images["image_grid_pinpoints"],
        "vision_feature_select_strategy": "full",
        "vision_feature_layer": [-2, -1],
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": text,
        "vision_config": vit("siglip_vision_model", layer_norm_eps=1e-6),
    }
    write_json(out, "preprocessor_config.json", images)
    processor = {
        "processor_class": "LlavaNextProcessor",
        "patch_size": 14,
        "vision_feature_select_strategy": "full",
        "image_token": "<image>",
        "num_additional_image_tokens": 0,
    }
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


# --- granite4_vision: anyres SigLIP, windowed Q-Former projectors injected as deepstack features ---


def build_granite4_vision(out: Path, seed: int) -> Path:
    tokenizer = save_named_tokenizer(out, {"image_token": "<image>"}, chat_template("<image>"))
    text = {
        **llama_text(len(tokenizer), "granitemoehybrid"),
        "tie_word_embeddings": True,
        "attention_multiplier": 0.0625,
        "residual_multiplier": 1.0,  # see granite_vision
    }
    images = anyres_images("LlavaNextImageProcessor", 56, HALF, HALF)
    config = {
        "model_type": "granite4_vision",
        "image_token_index": ids(tokenizer, "<image>")[0],
        "vocab_size": len(tokenizer),
        "image_grid_pinpoints": images["image_grid_pinpoints"],
        "vision_feature_select_strategy": "full",
        "downsample_rate": "1/2",  # 2x2 windows of the 4x4 patch grid, one query each
        "deepstack_layer_map": [[-2, 0]],
        "spatial_target_layers": [0, 1, 1, 1],
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": text,
        # the Q-Former has hidden_size // 64 heads, so 64 is the smallest width
        "vision_config": {
            **vit("siglip_vision_model", image_size=56, layer_norm_eps=1e-6),
            "hidden_size": 64,
        },
    }
    write_json(out, "preprocessor_config.json", images)
    processor = {
        "processor_class": "Granite4VisionProcessor",
        "patch_size": 14,
        "vision_feature_select_strategy": "full",
        "image_token": "<image>",
        "num_additional_image_tokens": 0,
        "downsample_rate": "1/2",
    }
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


# --- llava_bunny: a SigLIP tower whose 729 patch features replace the one id -200 ---


def build_llava_bunny(out: Path, seed: int) -> Path:
    """mlx-vlm's Bunny image processor always resizes to 384 px and the model asserts 729 (27x27)
    patch features, so only the widths can be tiny: every image adds 728 positions."""
    tokenizer = save_tokenizer(out, ["<image>"], chat_template("<image>"))
    text = {**llama_text(len(tokenizer), "qwen2"), "attention_bias": True, "tie_word_embeddings": True}
    vision = {**vit("siglip_vision_model", image_size=384, layer_norm_eps=1e-6), "num_hidden_layers": 1}
    config = {
        **{key: value for key, value in text.items() if key != "model_type"},
        "model_type": "llava-qwen2",
        "architectures": ["BunnyQwenForCausalLM"],
        "auto_map": {},
        "mm_hidden_size": 32,
        "mm_projector_type": "mlp2x_gelu",
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "vision_config": vision,
    }
    save_model(out, config, seed)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "llava_next": build_llava_next,
    "llava_onevision": build_llava_onevision,
    "granite_vision": build_granite_vision,
    "granite4_vision": build_granite4_vision,
    "llava_bunny": build_llava_bunny,
}

NOT_BUILDABLE: dict[str, str] = {
    "fastvlm": (
        "the FastViTHD tower shape (layers [2, 12, 24, 4, 2], embed_dims up to 1536, about 125M "
        "parameters) is class attributes of VisionConfig, not dataclass fields, so config.json "
        "cannot shrink it"
    ),
}
