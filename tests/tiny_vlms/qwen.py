"""Tiny random-weight builders for Qwen's vision-language models: Qwen3-VL-MoE, Qwen3.5 (dense and MoE),
Qwen4-exp and the Qwen3-Omni-MoE thinker, plus two models on Qwen3 / Qwen3.5 language models under their
own model types (Mage-VL, IndicOCR). Each builder writes one model directory (config, random weights,
processor files, tokenizer) that mlx-vlm itself loads and generates from with images; nothing outside
it.

Every model is 64 wide with 2 text layers; where an architecture mixes layer kinds (linear / full /
sparse attention, dense / expert MLPs) the two layers take one kind each. The Qwen vision pieces
(tokens, image processor, vision config, token ids) are shared with moe_hybrids.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json
from tests.tiny_vlms.parts import QWEN35_TEXT

QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def _name_special_tokens(out: Path, names: dict[str, str]) -> None:
    """Named special tokens (`tokenizer.image_token`, ...) that some processors read."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["extra_special_tokens"] = names
    path.write_text(json.dumps(config, indent=1))


# ---- Qwen3-VL family: 16x16 patches, 2x2 merge, M-RoPE text model --------------------------------


def qwen3_image_processor(patch_size: int = 16, processor: str = "Qwen3VLProcessor") -> dict:
    # 48x40 pictures grow to 64x96 pixels: 3x2 merged 32x32 areas, 6 image tokens.
    pixels = {"shortest_edge": 64 * 64, "longest_edge": 64 * 128}
    return {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": processor,
        "size": pixels,
        "min_pixels": pixels["shortest_edge"],
        "max_pixels": pixels["longest_edge"],
        "patch_size": patch_size,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }


def qwen3_vision(model_type: str, deepstack: list[int]) -> dict:
    return {
        "model_type": model_type,
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": deepstack,
        "in_channels": 3,
    }


def _qwen3_text(model_type: str, vocab_size: int, **extra) -> dict:
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
        **extra,
    }


def qwen_ids(tokenizer) -> dict:
    ids = token_ids(tokenizer, QWEN_TOKENS)
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }


MOE_TEXT = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
}


def build_qwen3_vl_moe(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, QWEN_TOKENS, chat_template(QWEN_IMAGE))
    config = {
        "model_type": "qwen3_vl_moe",
        "text_config": _qwen3_text("qwen3_vl_moe_text", len(tokenizer), **MOE_TEXT),
        "vision_config": qwen3_vision("qwen3_vl_moe", [0]),
        "vocab_size": len(tokenizer),
        **qwen_ids(tokenizer),
    }
    write_json(out, "preprocessor_config.json", qwen3_image_processor())
    save_model(out, config, seed)
    return out


def _qwen3_5_text(model_type: str, vocab_size: int, **extra) -> dict:
    # Layer 0 is a gated-delta (linear attention) layer, layer 1 full attention with partial M-RoPE.
    rope = {"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True}
    return {
        **_qwen3_text(model_type, vocab_size, **extra),
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "rope_parameters": {**rope, "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
    }


def _build_qwen3_5(out: Path, seed: int, model_type: str, text_extra: dict) -> Path:
    tokenizer = save_tokenizer(out, QWEN_TOKENS, chat_template(QWEN_IMAGE))
    eos = qwen_ids(tokenizer)["eos_token_id"]  # qwen4_exp's per-layer n-grams restart after it
    config = {
        "model_type": model_type,
        "text_config": _qwen3_5_text(f"{model_type}_text", len(tokenizer), eos_token_id=eos, **text_extra),
        "vision_config": qwen3_vision(model_type, []),
        "vocab_size": len(tokenizer),
        **qwen_ids(tokenizer),
    }
    write_json(out, "preprocessor_config.json", qwen3_image_processor())
    save_model(out, config, seed)
    return out


QWEN4_EXP_TEXT = {
    **MOE_TEXT,
    "shared_expert_intermediate_size": 32,
    "layer_types": ["linear_attention", "qwen_sparse_attention"],
    "hc_count": 2,  # hyper-connections: 2 residual streams
    "hc_lowrank": 8,
    "heads_per_ngram": 2,
    "indexer_n_heads": 2,
    "indexer_head_dim": 16,
    "indexer_budget": 16,
    "indexer_compress_ratio": 4,
    "indexer_kv_heads": 1,
    "mtp_num_hidden_layers": 0,
    # Per-layer n-gram embeddings (hashed from the token ids) feed layer 1 (one-indexed, linear).
    "ple_layer_ids": [1],
    "ngram_vocab_size_base": 101,
    "make_ngram_vocab_size_divisible_by": 8,
    "split_ngram_parts": 2,
}


def build_qwen3_5(out: Path, seed: int) -> Path:
    return _build_qwen3_5(out, seed, "qwen3_5", {})


def build_qwen3_5_moe(out: Path, seed: int) -> Path:
    moe = {**MOE_TEXT, "shared_expert_intermediate_size": 32}
    return _build_qwen3_5(out, seed, "qwen3_5_moe", moe)


def build_qwen4_exp(out: Path, seed: int) -> Path:
    return _build_qwen3_5(out, seed, "qwen4_exp", QWEN4_EXP_TEXT)


# ---- Qwen3-Omni-MoE: the thinker (Qwen3-VL-MoE text + vision + audio encoder), no talker -----------

OMNI_NAMES = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}


def _omni_audio() -> dict:
    return {
        "d_model": 32,
        "encoder_layers": 1,
        "num_hidden_layers": 1,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "output_dim": 64,
        "downsample_hidden_size": 16,
        "num_mel_bins": 128,
    }


def build_qwen3_omni_moe(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, list(OMNI_NAMES.values()), chat_template(QWEN_IMAGE))
    _name_special_tokens(out, OMNI_NAMES)
    ids = token_ids(tokenizer, list(OMNI_NAMES.values()))
    text = _qwen3_text("qwen3_omni_moe_text_encoder", len(tokenizer), **MOE_TEXT)
    text["rope_scaling"] = {"type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    thinker = {
        "text_config": text,
        "vision_config": qwen3_vision("qwen3_omni_moe_vision_encoder", [0]),
        "audio_config": _omni_audio(),
        **qwen_ids(tokenizer),
        "audio_token_id": ids["<|audio_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "audio_end_token_id": ids["<|audio_end|>"],
    }
    config = {
        "model_type": "qwen3_omni_moe",
        "enable_audio_output": False,  # no talker or code2wav: text out only
        "thinker_config": thinker,
        "talker_config": {"text_config": text, "thinker_hidden_size": 64},  # parsed, never built
        "eos_token_id": thinker["eos_token_id"][0],
    }
    audio = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128}
    write_json(out, "preprocessor_config.json", {**qwen3_image_processor(), **audio})
    save_model(out, config, seed)
    return out


# --- Mage-VL: a ViT with 3D RoPE and a 2x2 merger, a Qwen3 LM (1-D RoPE) --------------------------------


def build_mage_vl(out: Path, seed: int) -> Path:
    """Pictures resize to 64x64 px (min = max pixels): 4x4 patches of 16 px, merged 2x2 into 4 tokens."""
    template = chat_template("<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer = save_tokenizer(out, QWEN_TOKENS, template)
    ids = token_ids(tokenizer, QWEN_TOKENS)
    text = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    text |= {"vocab_size": len(tokenizer), "rope_theta": 10000.0}
    # head_dim 32: its half splits 4:6:6 between the (t, h, w) rotary axes in multiples of 16
    vision = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    vision |= {"patch_size": 16, "image_size": 64, "spatial_merge_size": 2, "temporal_patch_size": 1}
    vision |= {"out_hidden_size": 64, "text_hidden_size": 64}
    config = {"model_type": "mage_vl", "text_config": text, "vision_config": vision}
    config |= {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"]}
    config |= {"vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    preprocessor = {"patch_size": 16, "temporal_patch_size": 1, "merge_size": 2}
    preprocessor |= {"min_pixels": 64 * 64, "max_pixels": 64 * 64}
    write_json(out, "preprocessor_config.json", preprocessor)
    return out


# --- IndicOCR (OCR stage): Qwen3.5-VL under its own model_type, with Qwen3-VL's processor -----------------


def build_indic_ocr(out: Path, seed: int) -> Path:
    """Pictures resize to 64x64 px: 4x4 patches of 16 px (2 frames), merged 2x2 into 4 image tokens. The
    language model is the hybrid Qwen3.5 (gated-delta + full attention) with M-RoPE."""
    template = chat_template("<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer = save_tokenizer(out, QWEN_TOKENS, template)
    ids = token_ids(tokenizer, QWEN_TOKENS)
    text = {"model_type": "qwen3_5_text", **QWEN35_TEXT, "vocab_size": len(tokenizer)}
    text |= {"max_position_embeddings": 4096}
    vision = {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32, "intermediate_size": 64}
    vision |= {"out_hidden_size": 64, "num_heads": 2, "patch_size": 16, "spatial_patch_size": 16}
    vision |= {"spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64}
    config = {"model_type": "indic_ocr", "text_config": text, "vision_config": vision}
    config |= {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"]}
    config |= {"vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}
    config |= {"vocab_size": len(tokenizer), "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")]}
    save_model(out, config, seed)
    preprocessor = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
    write_json(out, "preprocessor_config.json", preprocessor | {"min_pixels": 4096, "max_pixels": 4096})
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "qwen3_vl_moe": build_qwen3_vl_moe,
    "qwen3_5": build_qwen3_5,
    "qwen3_5_moe": build_qwen3_5_moe,
    "qwen3_omni_moe": build_qwen3_omni_moe,
    "qwen4_exp": build_qwen4_exp,
    "mage_vl": build_mage_vl,
    "indic_ocr": build_indic_ocr,
}

NOT_BUILDABLE: dict[str, str] = {
    "qwen3_5_text": "not a vision model: mlx-vlm's qwen3_5_text is the text-only Qwen3.5 language model "
    "(no vision tower, no image inputs)",
}
