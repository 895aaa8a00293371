"""Tiny builders for the vision families people run most: SmolVLM / Idefics3, Qwen2-VL, Qwen2.5-VL,
Qwen3-VL (DeepStack), Gemma 3, PaliGemma, LLaVA, Pixtral and Mistral 3."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlm import QWEN_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS, build_tiny_qwen2_vl, build_tiny_vlm
from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, write_json

TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
CLIP_MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def build_idefics3(out: Path, seed: int) -> Path:
    path = build_tiny_vlm(out, seed)
    config_file = path / "config.json"
    config_file.write_text(config_file.read_text().replace('"smolvlm"', '"idefics3"'))
    return path


def build_qwen3_vl(out: Path, seed: int, vision_scale: bool = False) -> Path:
    """`vision_scale`: a vision tower of real proportions (8 blocks, width 256) taking 448x448 pictures,
    for benchmarks of what the encoder costs."""
    tokenizer = save_tokenizer(out, QWEN_SPECIAL_TOKENS, QWEN_CHAT_TEMPLATE)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    text = {
        **TEXT,
        "model_type": "qwen3_vl",
        "num_hidden_layers": 3,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": len(tokenizer),
        "rope_theta": 5000000.0,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    }
    vision = {
        "model_type": "qwen3_vl",
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0, 1],
    }
    if vision_scale:
        vision.update(
            depth=8, hidden_size=256, intermediate_size=1024, num_heads=4, num_position_embeddings=784
        )
    config = {
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vocab_size": len(tokenizer),
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    max_pixels = 448 * 448 if vision_scale else 64 * 128
    processor = {"min_pixels": 64 * 64, "max_pixels": max_pixels, "patch_size": 16, "merge_size": 2}
    write_json(
        out, "preprocessor_config.json", {"processor_class": "Qwen3VLProcessor", **processor, **CLIP_MEAN_STD}
    )
    save_model(out, config, seed)
    return out


def build_gemma3(out: Path, seed: int) -> Path:
    tokens = ["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<pad>"]
    template = chat_template("<start_of_image>")
    names = {"boi_token": tokens[0], "eoi_token": tokens[1], "image_token": tokens[2]}
    tokenizer = save_tokenizer(out, tokens, template, names)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tokens}
    text = {
        **TEXT,
        "model_type": "gemma3_text",
        "num_hidden_layers": 2,
        "head_dim": 16,
        "vocab_size": len(tokenizer),
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
        "mm_tokens_per_image": 4,
    }
    vision = _siglip(image_size=32, patch_size=8)
    config = {
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": vision,
        "mm_tokens_per_image": 4,
        "image_token_index": ids["<image_soft_token>"],
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "vocab_size": len(tokenizer),
        "pad_token_id": ids["<pad>"],  # Gemma's own <pad>, never in a prompt (its rows are zeroed)
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    image = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 32, "width": 32}}
    image.update(CLIP_MEAN_STD, do_resize=True, do_rescale=True, rescale_factor=1 / 255, do_normalize=True)
    write_json(out, "preprocessor_config.json", {**image, "processor_class": "Gemma3Processor"})
    write_json(out, "processor_config.json", {"processor_class": "Gemma3Processor", "image_seq_length": 4})
    save_model(out, config, seed)
    return out


def _siglip(image_size: int, patch_size: int, **extra) -> dict:
    return {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "image_size": image_size,
        "patch_size": patch_size,
        **extra,
    }


MISTRAL_IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def build_pixtral(out: Path, seed: int, model_type: str = "pixtral") -> Path:
    """Pixtral: a 2-D RoPE vision encoder over 8x8 patches, one [IMG] token per patch (Mistral 3: per
    2x2 patches, merged), rows ended by [IMG_BREAK], the image by [IMG_END]."""
    tokenizer = save_tokenizer(out, MISTRAL_IMAGE_TOKENS, chat_template("[IMG]"))
    merge = 2 if model_type == "mistral3" else 1
    text = {
        **TEXT,
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "head_dim": 16,
        "vocab_size": len(tokenizer),
    }
    text.update(rms_norm_eps=1e-5, rope_theta=1000000.0, max_position_embeddings=4096)
    vision = {
        "model_type": "pixtral",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "head_dim": 16,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = {
        "model_type": model_type,
        "text_config": text,
        "vision_config": vision,
        "image_token_index": tokenizer.convert_tokens_to_ids("[IMG]"),
        "vocab_size": len(tokenizer),
        "spatial_merge_size": merge,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    image = {"image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": 32}}
    image.update(patch_size={"height": 8, "width": 8}, **CLIP_MEAN_STD)
    write_json(out, "preprocessor_config.json", image)
    processor = {"processor_class": "PixtralProcessor", "patch_size": 8, "spatial_merge_size": merge}
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


def build_llava(out: Path, seed: int) -> Path:
    """LLaVA 1.5: a CLIP vision tower (32x32 pixels, 8x8 patches), an MLP projector, a Llama model."""
    tokenizer = save_tokenizer(out, ["<image>"], chat_template("<image>"))
    text = {**TEXT, "model_type": "llama", "num_hidden_layers": 2, "vocab_size": len(tokenizer)}
    vision = {
        "model_type": "clip_vision_model",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
        "projection_dim": 32,
    }
    config = {
        "model_type": "llava",
        "text_config": text,
        "vision_config": vision,
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "vocab_size": len(tokenizer),
        "vision_feature_layer": -1,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    image = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32}}
    image.update(crop_size={"height": 32, "width": 32}, do_center_crop=True, **CLIP_MEAN_STD)
    write_json(out, "preprocessor_config.json", image)
    processor = {
        "processor_class": "LlavaProcessor",
        "patch_size": 8,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,  # the CLS token, which the "default" strategy drops
    }
    write_json(out, "processor_config.json", processor)
    save_model(out, config, seed)
    return out


def build_paligemma(out: Path, seed: int) -> Path:
    """PaliGemma: SigLIP (32x32 pixels, 8x8 patches: 16 image tokens) and a Gemma model whose prompt
    attends bidirectionally (prefix-LM)."""
    tokenizer = save_tokenizer(out, ["<image>"], chat_template("<image>"), {"image_token": "<image>"})
    text = {
        **TEXT,
        "model_type": "gemma",
        "num_hidden_layers": 2,
        "head_dim": 16,
        "vocab_size": len(tokenizer),
    }
    config = {
        "model_type": "paligemma",
        "text_config": text,
        "vision_config": _siglip(image_size=32, patch_size=8, projection_dim=64),
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "projection_dim": 64,
        "pad_token_id": tokenizer.pad_token_id or 0,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    image = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 32, "width": 32}}
    image.update(image_seq_length=16, processor_class="PaliGemmaProcessor", **CLIP_MEAN_STD)
    write_json(out, "preprocessor_config.json", image)
    save_model(out, config, seed)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "smolvlm": build_tiny_vlm,
    "idefics3": build_idefics3,
    "qwen2_vl": build_tiny_qwen2_vl,
    "qwen2_5_vl": lambda out, seed: build_tiny_qwen2_vl(out, seed, "qwen2_5_vl"),
    "qwen3_vl": build_qwen3_vl,
    "gemma3": build_gemma3,
    "pixtral": build_pixtral,
    "mistral3": lambda out, seed: build_pixtral(out, seed, "mistral3"),
    "llava": build_llava,
    "paligemma": build_paligemma,
}
