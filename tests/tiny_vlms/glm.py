"""Tiny random-weight builders for the GLM-4V family: GLM-4V, GLM-4V-MoE, GLM-OCR and GLM-5-Next. Each
builder writes one model directory (config, random weights, processor files, tokenizer) that mlx-vlm
itself loads and generates from with images; nothing outside it.

Every model is 64 wide with 2 text layers; where an architecture mixes layer kinds (linear / sparse
attention, dense / expert MLPs) the two layers take one kind each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json
from tests.tiny_vlms.parts import CLIP_MEAN, CLIP_STD
from tests.tiny_vlms.weights import MOE_ROUTER, randomize_zero_weights

# ---- GLM-4V family: 14x14 patches, 2x2 merge (conv downsample), M-RoPE on half of each head -------

GLM_TOKENS = ["<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|video|>", "<|user|>", "<|assistant|>"]
GLM_IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"


def _glm_image_processor() -> dict:
    # 48x40 pictures grow to 56x84 pixels: 3x2 merged 28x28 areas, 6 image tokens.
    pixels = {"shortest_edge": 56 * 56, "longest_edge": 56 * 112}
    return {
        "image_processor_type": "Glm4vImageProcessor",
        "size": pixels,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }


def _glm_vision(model_type: str) -> dict:
    return {
        "model_type": model_type,
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "image_size": 56,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
    }


def _glm_text(model_type: str, vocab_size: int, eos: list[int], **extra) -> dict:
    return {
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 1, 1]},
        "eos_token_id": eos,
        "pad_token_id": 0,
        **extra,
    }


def _glm_ids(tokenizer) -> dict:
    ids = token_ids(tokenizer, GLM_TOKENS)
    return {
        "image_token_id": ids["<|image|>"],
        "image_token_index": ids["<|image|>"],
        "video_token_id": ids["<|video|>"],
        "video_token_index": ids["<|video|>"],
        "vision_start_token_id": ids["<|begin_of_image|>"],
        "vision_end_token_id": ids["<|end_of_image|>"],
        "eos_token_id": [ids["<|user|>"], tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }


def _build_glm(out: Path, seed: int, model_type: str, text_extra: dict, make_text=None) -> Path:
    tokenizer = save_tokenizer(out, GLM_TOKENS, chat_template(GLM_IMAGE))
    ids = _glm_ids(tokenizer)
    text = (make_text or _glm_text)(f"{model_type}_text", len(tokenizer), ids["eos_token_id"], **text_extra)
    config = {
        "model_type": model_type,
        "text_config": text,
        "vision_config": _glm_vision(model_type),
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        **ids,
    }
    write_json(out, "preprocessor_config.json", _glm_image_processor())
    save_model(out, config, seed)
    return out


def build_glm4v(out: Path, seed: int) -> Path:
    return _build_glm(out, seed, "glm4v", {})


GLM_MOE_TEXT = {
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "routed_scaling_factor": 1.0,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,  # layer 0 dense, layer 1 mixture of experts
    "use_qk_norm": False,
    "attention_bias": True,
    "tie_word_embeddings": False,
}


def build_glm4v_moe(out: Path, seed: int) -> Path:
    _build_glm(out, seed, "glm4v_moe", GLM_MOE_TEXT)
    randomize_zero_weights(out, seed, MOE_ROUTER)
    return out


def _glm_ocr_text(model_type: str, vocab_size: int, eos: list[int]) -> dict:
    # The config class takes exactly its own fields: rope settings live in rope_parameters.
    text = _glm_text(model_type, vocab_size, eos, tie_word_embeddings=False, num_nextn_predict_layers=0)
    for key in ("rope_theta", "partial_rotary_factor", "rope_scaling"):
        text.pop(key)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "partial_rotary_factor": 1.0}
    return {**text, "rope_parameters": {**rope, "rope_theta": 10000.0}}


def build_glm_ocr(out: Path, seed: int) -> Path:
    return _build_glm(out, seed, "glm_ocr", {}, _glm_ocr_text)


def _glm5_next_text(vocab_size: int, eos: list[int]) -> dict:
    # Layer 0: linear attention + dense MLP; layer 1: NoPE sparse MLA attention + mixture of experts.
    return {
        "model_type": "glm5_next_text",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 0,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "index_topk": 16,
        "index_kpool": 4,
        "index_head_dim": 16,
        "index_n_heads": 2,
        "linear_head_dim": 16,
        "linear_num_heads": 4,
        "hc_mult": 2,
        "first_k_dense_replace": 1,
        "layer_types": ["linear_attention", "deepseek_sparse_attention"],
        "indexer_types": ["full", "full"],
        "eos_token_id": eos,
        "pad_token_id": 0,
    }


def build_glm5_next(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(
        out, GLM_TOKENS + ["<|begin_of_video|>", "<|end_of_video|>"], chat_template(GLM_IMAGE)
    )
    ids = _glm_ids(tokenizer)
    vision = {**_glm_vision("glm5_next_vision"), "projection_intermediate_size": 64}
    config = {
        "model_type": "glm5_next",
        "text_config": _glm5_next_text(len(tokenizer), ids["eos_token_id"]),
        "vision_config": vision,
        "image_token_id": ids["image_token_id"],
        "video_token_id": ids["video_token_id"],
        "image_start_token_id": ids["vision_start_token_id"],
        "image_end_token_id": ids["vision_end_token_id"],
        "eos_token_id": ids["eos_token_id"],
    }
    # For Glm5NextProcessor.from_pretrained; mlx-vlm's loader then swaps in Glm5NextImageProcessor() at
    # its defaults (at least 16 tokens): 48x40 pictures become 20 image tokens.
    image = {"patch_size": 14, "merge_size": 2, "min_image_tokens": 4, "max_image_tokens": 8}
    write_json(out, "processor_config.json", {"image_processor": image, "video_processor": image})
    save_model(out, config, seed)
    randomize_zero_weights(out, seed, MOE_ROUTER)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "glm4v": build_glm4v,
    "glm4v_moe": build_glm4v_moe,
    "glm_ocr": build_glm_ocr,
    "glm5_next": build_glm5_next,
}

NOT_BUILDABLE: dict[str, str] = {}
