"""Tiny random-weight builders for vision models on mixture-of-experts language models, most of them mixing
attention kinds too: MiMo-V2, ZAYA1-VL (both on Qwen vision pieces from qwen.py), Step-3.7,
MiniMax-M3-VL, Inkling and Moondream 3. Each builder writes one model directory (config, random weights,
processor files, tokenizer) that mlx-vlm itself loads and generates from with images; nothing outside
it.

Every model is 64 wide with 2 text layers; where an architecture mixes layer kinds (full /
sliding-window / block-sparse attention, dense / expert MLPs) the two layers take one kind each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json
from tests.tiny_vlms.qwen import QWEN_IMAGE, QWEN_TOKENS, qwen3_image_processor, qwen3_vision, qwen_ids
from tests.tiny_vlms.weights import MOE_ROUTER, randomize_zero_weights, rescale

# ---- MiMo-V2: a windowed ViT with attention sinks, and a hybrid sliding-window / full MoE text model --


def _mimo_v2_text(vocab_size: int) -> dict:
    # Flat (top-level) text fields; layer 0 full attention + dense MLP, layer 1 sliding window + experts.
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "v_head_dim": 16}
    swa = {
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 2,
        "swa_head_dim": 16,
        "swa_v_head_dim": 16,
    }
    return {
        **heads,
        **swa,
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "partial_rotary_factor": 0.5,
        "sliding_window_size": 8,
        "hybrid_layer_pattern": [0, 1],
        "moe_layer_freq": [0, 1],
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "routed_scaling_factor": 1.0,
    }


# The audio encoder is built whatever the prompt holds: its defaults write 1 GB of weights.
_MIMO_AUDIO = {
    "out_hidden_size": 64,
    "input_local_attn_heads": 2,
    "input_local_dim": 32,
    "input_local_head_dim": 16,
    "input_local_intermediate_size": 64,
    "input_local_layers": 1,
}


def build_mimo_v2(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, QWEN_TOKENS + ["<|audio_pad|>"], chat_template(QWEN_IMAGE))
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "num_key_value_heads": 1,
        "qk_channels": 16,
        "fullatt_block_indexes": [1],
        "visual_token_window_size": 4,
    }
    ids = qwen_ids(tokenizer)
    config = {
        **_mimo_v2_text(len(tokenizer)),
        "model_type": "mimo_v2",
        "vision_config": vision,
        "audio_config": _MIMO_AUDIO,
        **ids,
        "eos_token_id": ids["eos_token_id"][0],
    }
    write_json(out, "preprocessor_config.json", qwen3_image_processor(16, "MiMoV2Processor"))
    save_model(out, config, seed)
    randomize_zero_weights(out, seed, MOE_ROUTER)
    return out


# ---- ZAYA1-VL: a Qwen2.5-VL vision tower and a CCA-attention mixture-of-experts text model ------------

ZAYA_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<image>"]


def _zaya1_text(vocab_size: int) -> dict:
    # Flat (top-level) text fields: compressed convolutional attention, a routed MLP with a skip expert.
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "ffn_hidden_size": 128,
        "num_hidden_layers": 2,
        "num_experts": 4,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "zaya_mlp_expansion": 16,
        "vision_lora_rank_attn": 4,
        "vision_lora_rank_mlp": 8,
        "tie_word_embeddings": True,
    }


def build_zaya1_vl(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, ZAYA_TOKENS, chat_template("<|vision_start|><image><|vision_end|>"))
    ids = token_ids(tokenizer, ZAYA_TOKENS)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = {
        **_zaya1_text(len(tokenizer)),
        "model_type": "zaya1_vl",
        "vision_config": {**qwen3_vision("qwen2_5_vl", []), "patch_size": 14, "window_size": 56},
        "image_token_id": ids["<image>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": eos,
        "bos_token_id": tokenizer.bos_token_id or 0,
    }
    write_json(out, "preprocessor_config.json", qwen3_image_processor(14, "Zaya1VLProcessor"))
    save_model(out, config, seed)
    return out


# ---- Step-3.7: a Perception-Encoder ViT at a fixed 728 px and a Step-3.5 (MoE, sliding window) text model

STEP_TOKENS = ["<im_patch>", "<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"]


def _step3p5_text(vocab_size: int) -> dict:
    # Layer 0 full attention + dense MLP; layer 1 sliding window (4 tokens) + experts.
    return {
        "model_type": "step3p5",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_attention_groups": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "moe_intermediate_size": 32,
        "moe_num_experts": 4,
        "moe_top_k": 2,
        "share_expert_dim": 32,
        "moe_layers_enum": [1],
        "layer_types": ["full_attention", "sliding_attention"],
        "sliding_window": 4,
        "max_position_embeddings": 4096,
    }


def build_step3p7(out: Path, seed: int) -> Path:
    # The processor hard-codes the picture size: every image is resized to 728x728 pixels (52x52 patches
    # of 14x14), pooled to 13x13 = 169 image tokens; small pictures get no extra crops.
    tokenizer = save_tokenizer(out, STEP_TOKENS, chat_template("<im_patch>"))
    vision = {"width": 32, "layers": 2, "heads": 2, "mlp_ratio": 2.0, "patch_size": 14, "image_size": 728}
    image_id = tokenizer.convert_tokens_to_ids("<im_patch>")
    config = {
        "model_type": "step3p7",
        "text_config": _step3p5_text(len(tokenizer)),
        "vision_config": vision,
        "image_token_id": image_id,
        "vocab_size": len(tokenizer),
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    save_model(out, config, seed)
    return out


# ---- MiniMax-M3-VL: a CLIP ViT with 3-D RoPE, a 2x2 patch merge, and a block-sparse-attention MoE LM --

MINIMAX_TOKENS = ["]<]image[>[", "]<]video[>[", "]<]start of image[>[", "]<]end of image[>["]


def _minimax_m3_text(vocab_size: int) -> dict:
    # Layer 0 full attention + dense MLP; layer 1 block-sparse attention (blocks of 4) + experts.
    return {
        "model_type": "minimax_m3",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 32,
        "dense_intermediate_size": 128,
        "shared_intermediate_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "mlp_layer_types": ["dense", "sparse"],
        "layer_types": ["full_attention", "minimax_m3_sparse"],
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_block_size": 4,
        "index_topk_blocks": 2,
        "index_local_blocks": 1,
        "max_position_embeddings": 4096,
    }


def build_minimax_m3_vl(out: Path, seed: int) -> Path:
    tokenizer = save_tokenizer(out, MINIMAX_TOKENS, chat_template("]<]image[>["))
    ids = token_ids(tokenizer, MINIMAX_TOKENS)
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "image_size": 56,
        "patch_size": 14,
        "projection_dim": 64,
    }
    config = {
        "model_type": "minimax_m3_vl",
        "text_config": _minimax_m3_text(len(tokenizer)),
        "vision_config": vision,
        "image_token_index": ids["]<]image[>["],
        "video_token_index": ids["]<]video[>["],
        "vision_start_token_id": ids["]<]start of image[>["],
        "vision_end_token_id": ids["]<]end of image[>["],
        "projector_hidden_size": 64,
        "vocab_size": len(tokenizer),
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    # 48x40 pictures grow to a 56-pixel short side: 56x84 pixels, 3x2 merged 28x28 areas, 6 tokens.
    image = {"patch_size": 14, "merge_size": 2, "min_pixels": 56 * 56, "min_short_side_pixel": 56}
    write_json(out, "preprocessor_config.json", image)
    save_model(out, config, seed)
    randomize_zero_weights(out, seed, "patch_embedding")  # created with mx.zeros
    return out


# --- Inkling: an HMLP patch encoder (40 px patches), a hybrid sliding/global MoE LM ----------------------

INKLING_TOKENS = ["<|unused_200054|>", "<|content_image|>", "<|unused_200053|>", "<|content_audio_input|>"]


def build_inkling(out: Path, seed: int) -> Path:
    """The processor (always InklingImageProcessor()) cuts pictures into 40 px tiles, one image token
    each: 2 for a 48x40 picture. Two encoder layers (10x10, then 2x4x4 folds) reach the LM width;
    more layers pass a 4800-wide stage (~25M parameters)."""
    tokenizer = save_tokenizer(out, INKLING_TOKENS, chat_template("<|content_image|><|unused_200054|>"))
    ids = token_ids(tokenizer, INKLING_TOKENS)
    config = {"model_type": "inkling", "text_config": _inkling_text(len(tokenizer))}
    config |= {"vision_config": {"patch_size": 40, "temporal_patch_size": 2, "n_layers": 2}}
    config |= {"image_token_id": ids["<|unused_200054|>"], "audio_token_id": ids["<|unused_200053|>"]}
    config |= {"vocab_size": len(tokenizer), "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")]}
    save_model(out, config, seed)
    return out


def _inkling_text(vocab_size: int) -> dict:
    """A sliding-window dense layer, then a global MoE layer (4 experts, 2 a token, 1 shared)."""
    return {
        "model_type": "inkling",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "vocab_size": vocab_size,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 2,
        "swa_head_dim": 16,
        "sliding_window_size": 64,
        "layer_types": ["hybrid_sliding", "full_attention"],
        "mlp_layer_types": ["dense", "moe"],
        "d_rel": 4,
        "rel_extent": 64,
        "intermediate_size": 32,
        "dense_intermediate_size": 128,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
    }


# --- Moondream 3: a ViT over one global crop, an MLP projector, a MoE LM with a bidirectional prefix -------


def build_moondream3(out: Path, seed: int) -> Path:
    """The processor always writes 729 image placeholders (a 27x27 grid), so the crop is 54 px of 2 px
    patches; max_crops 1 keeps only the global crop. The processor wraps the whole rendered prompt as
    "Question: ... Answer:" after the image, so the template carries no image marker."""
    tokenizer = save_tokenizer(out, [], chat_template(""))
    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": len(tokenizer)}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "rope_dim": 8}
    text |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "moe_start_layer": 1}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"patch_size": 2, "crop_size": 54, "max_crops": 1, "overlap_margin": 0}
    vision |= {"proj_inner_dim": 64, "proj_out_dim": 64}
    config = {"model_type": "moondream3", "text_config": text, "vision_config": vision}
    config |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    save_model(out, config, seed)
    # Sharper attention and larger image features, else the 729 image tokens average out
    rescale(out, {"proj_mlp.fc2.weight": 20.0, "attn.qkv.weight": 4.0})
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "mimo_v2": build_mimo_v2,
    "zaya1_vl": build_zaya1_vl,
    "step3p7": build_step3p7,
    "minimax_m3_vl": build_minimax_m3_vl,
    "inkling": build_inkling,
    "moondream3": build_moondream3,
}

NOT_BUILDABLE: dict[str, str] = {
    "moondream2": "Moondream2Processor always loads its tokenizer from the hub repo moondream/starmie-v1 "
    "(no local tokenizer option); unreachable offline",
}
