"""Tiny random-weight builders for Idefics2 and LFM2-VL, whose towers are NaViT-style SigLIP ViTs. Each
builder writes one model directory (config, random weights, processor files, tokenizer) that mlx-vlm
itself loads and generates from with images; nothing outside it.

Each keeps hidden sizes <= 64, 2 layers and at most 4 image tokens per picture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, ids, save_model, save_tokenizer, write_json
from tests.tiny_vlms.parts import HALF, llama_text, vit

# --- idefics2: a NaViT-style ViT and a perceiver resampler to a fixed number of latents ---

IDEFICS_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]


def build_idefics2(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, IDEFICS_TOKENS, chat_template("<image>"))
    vocab_size = len(tokenizer)
    config = {
        "model_type": "idefics2",
        "image_token_id": ids(tokenizer, "<image>")[0],
        "vocab_size": vocab_size,
        "eos_token_id": ids(tokenizer, "<end_of_utterance>", "<|im_end|>"),
        "text_config": llama_text(vocab_size, "mistral"),
        "vision_config": vit("idefics2_vision", image_size=28, layer_norm_eps=1e-6),
        "perceiver_config": {
            "model_type": "idefics2_perceiver",
            "num_key_value_heads": 2,
            "resampler_depth": 1,
            "resampler_head_dim": 16,
            "resampler_n_heads": 4,
            "resampler_n_latents": 4,
        },
    }
    images = {
        "image_processor_type": "Idefics2ImageProcessor",
        "do_image_splitting": False,
        "size": {"shortest_edge": 28, "longest_edge": 28},
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": HALF,
        "image_std": HALF,
        "do_pad": True,
        "do_convert_rgb": True,
    }
    write_json(out, "preprocessor_config.json", images)
    write_json(out, "processor_config.json", {"processor_class": "Idefics2Processor", "image_seq_len": 4})
    save_model(out, config, seed)
    return out


# --- lfm2_vl: a SigLIP2 NaViT over packed 8 px patches, pixel-unshuffle, a hybrid conv/attention LM ---

LFM2_TOKENS = ["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]


def build_lfm2_vl(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, LFM2_TOKENS, chat_template("<image>"))
    config = {
        "model_type": "lfm2-vl",
        "image_token_id": ids(tokenizer, "<image>")[0],
        "downsample_factor": 2,
        "encoder_patch_size": 8,
        "projector_hidden_size": 64,
        "eos_token_id": ids(tokenizer, "<|im_end|>")[0],
        "text_config": _lfm2_text(len(tokenizer)),
        "vision_config": vit("lfm2_vl", image_size=32, patch_size=8, num_patches=16, layer_norm_eps=1e-6),
    }
    # At most 4 image tokens (a 32x32 px area): the 48x40 test pictures stay one tile.
    images = {"encoder_patch_size": 8, "downsample_factor": 2, "min_image_tokens": 1, "max_image_tokens": 4}
    write_json(
        out, "preprocessor_config.json", {**images, "tile_size": 32, "image_mean": HALF, "image_std": HALF}
    )
    write_json(
        out, "processor_config.json", {"processor_class": "Lfm2VlProcessor", "use_image_special_tokens": True}
    )
    save_model(out, config, seed)
    return out


def _lfm2_text(vocab_size: int) -> dict:
    return {
        "model_type": "lfm2",
        "hidden_size": 64,
        "block_dim": 64,
        "conv_dim": 64,
        "conv_dim_out": 64,
        "intermediate_size": 128,
        "block_ff_dim": 128,
        "block_auto_adjust_ff_dim": False,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_heads": 4,
        "num_key_value_heads": 2,
        "layer_types": ["conv", "full_attention"],
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
    }


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "idefics2": build_idefics2,
    "lfm2_vl": build_lfm2_vl,
}

NOT_BUILDABLE: dict[str, str] = {}
