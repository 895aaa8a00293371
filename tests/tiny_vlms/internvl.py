"""Tiny random-weight builders for InternVL (the original internvl_chat and the Hugging Face port), and why
LLM-jp-VL (an InternVL processor) cannot be built here. Each builder writes one model directory (config,
random weights, processor files, tokenizer) that mlx-vlm itself loads and generates from with images;
nothing outside it.

Each keeps hidden sizes <= 64, 2 layers and a handful of image tokens per picture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, ids, save_model, save_tokenizer, write_json
from tests.tiny_vlms.parts import llama_text, vit

# --- internvl_chat: InternViT tiles of 56 px, pixel shuffle 0.5, an MLP into a Qwen2 LM ---

INTERNVL_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<image>"]


def build_internvl_chat(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, INTERNVL_TOKENS, chat_template("<image>"))
    config = {
        "model_type": "internvl_chat",
        "image_token_index": ids(tokenizer, "<IMG_CONTEXT>")[0],
        "vocab_size": len(tokenizer),
        "downsample_ratio": 0.5,
        "max_dynamic_patch": 1,  # one 56 px tile per image: (56 / 14)^2 * 0.5^2 = 4 image tokens
        "min_dynamic_patch": 1,
        "use_thumbnail": True,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "llm_config": {**llama_text(len(tokenizer), "qwen2"), "attention_bias": True},
        "vision_config": vit("intern_vit_6b", image_size=56, layer_norm_eps=1e-6, drop_path_rate=0.0),
    }
    write_json(out, "processor_config.json", {"num_image_token": 4, "image_size": 56, "patch_size": 14})
    save_model(out, config, seed)
    return out


def build_internvl(out: Path, seed: int) -> Path:
    """The Hugging Face port of InternVL: the same tiling and shuffle, a Qwen3 LM."""
    tokenizer = save_tokenizer(out, INTERNVL_TOKENS, chat_template("<image>"))
    text = {**llama_text(len(tokenizer), "qwen3"), "tie_word_embeddings": False}
    config = {
        "model_type": "internvl",
        "image_token_id": ids(tokenizer, "<IMG_CONTEXT>")[0],
        "vocab_size": len(tokenizer),
        "downsample_ratio": 0.5,
        "max_dynamic_patch": 1,
        "min_dynamic_patch": 1,
        "eos_token_id": ids(tokenizer, "<|im_end|>"),
        "text_config": text,
        "vision_config": vit("internvl_vision", image_size=56, layer_norm_eps=1e-6),
    }
    write_json(out, "processor_config.json", {"processor_class": "InternVLProcessor", "image_seq_length": 4})
    save_model(out, config, seed)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "internvl_chat": build_internvl_chat,
    "internvl": build_internvl,
}

NOT_BUILDABLE: dict[str, str] = {
    "llmjpvl": (
        "mlx-vlm ships no llmjpvl processor (the upstream one is remote code); transformers' "
        "InternVLProcessor needs InternVLVideoProcessor, which requires torch/torchvision "
        "(ValueError: Unrecognized video processor ... / torch not installed)"
    ),
}
