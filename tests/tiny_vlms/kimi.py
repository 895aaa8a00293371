"""Tiny random-weight builders for the models on a MoonViT vision tower: Kimi-VL, Kimi-K2.5 and Kimi-K3,
and LocateAnything. Each builder writes one model directory (config, random weights, processor files,
tokenizer) that mlx-vlm itself loads and generates from with images; nothing outside it.

Every model is 64 wide with 2 text layers; where an architecture mixes layer kinds (linear / latent
attention, dense / expert MLPs) the two layers take one kind each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids
from tests.tiny_vlms.weights import MOE_ROUTER, randomize_zero_weights, rescale

# ---- Kimi-VL: MoonViT (native resolution, 2x2 merge) and a DeepSeek-V3 (MLA + MoE) text model -----

KIMI_TOKENS = ["<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>", "<|im_assistant|>"]
KIMI_IMAGE = "<|media_start|>image<|media_content|><|media_pad|><|media_end|>"


def _deepseek_v3_text(vocab_size: int, **extra) -> dict:
    return {
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,  # layer 0 dense, layer 1 mixture of experts
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        **extra,
    }


def build_kimi_vl(out: Path, seed: int) -> Path:
    # mlx-vlm's loader swaps in KimiVLImageProcessor() at its defaults, 14x14 patches and a 2x2 merge,
    # without resizing: 48x40 pictures are center-cropped to 28x28, 1 image token.
    return _build_kimi(out, seed, "kimi_vl")


def build_kimi_k25(out: Path, seed: int) -> Path:
    # 48x40 pictures are padded to 56x56: 4x4 patches of 14x14, 2x2 merged = 4 image tokens.
    return _build_kimi(out, seed, "kimi_k25")


def _build_kimi(out: Path, seed: int, model_type: str) -> Path:
    tokenizer = save_tokenizer(out, KIMI_TOKENS, chat_template(KIMI_IMAGE))
    pad_id = tokenizer.convert_tokens_to_ids("<|media_pad|>")
    vision = {
        "model_type": "moonvit",
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "init_pos_emb_height": 4,
        "init_pos_emb_width": 4,
        "merge_kernel_size": [2, 2],
    }
    config = {
        "model_type": model_type,
        "text_config": _deepseek_v3_text(len(tokenizer)),
        "vision_config": vision,
        "vocab_size": len(tokenizer),
        "media_placeholder_token_id": pad_id,
        "image_token_index": pad_id,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    save_model(out, config, seed)
    randomize_zero_weights(out, seed, MOE_ROUTER)
    return out


KIMI_K3_TOKENS = [
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|end_of_msg|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
    "<|kimi_image_placeholder|>",
]


def _kimi_linear_text(vocab_size: int) -> dict:
    # Layer 1 (one-indexed) is a KDA linear-attention layer, layer 2 NoPE MLA; layer 2 has experts.
    linear = {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4, "kda_layers": [1]}
    return {
        "model_type": "kimi_linear",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "linear_attn_config": linear,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 0,
        "v_head_dim": 16,
        "num_experts": 4,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
    }


def build_kimi_k3(out: Path, seed: int) -> Path:
    # Kimi K3 renders chats with its own Python renderer (no Jinja template); 48x40 pictures are
    # padded to 56x56: 4x4 patches of 14x14, 2x2 merged = 4 image tokens.
    tokenizer = save_tokenizer(out, KIMI_K3_TOKENS, chat_template("<|kimi_image_placeholder|>"))
    pad_id = tokenizer.convert_tokens_to_ids("<|media_pad|>")
    vision = {
        "patch_size": 14,
        "init_pos_emb_height": 4,
        "init_pos_emb_width": 4,
        "init_pos_emb_time": 1,
        "vt_num_attention_heads": 2,
        "vt_num_hidden_layers": 2,
        "vt_hidden_size": 32,
        "vt_intermediate_size": 64,
        "qkv_hidden_size": 32,
        "mm_hidden_size": 32,
        "text_hidden_size": 64,
    }
    config = {
        "model_type": "kimi_k3",
        "text_config": _kimi_linear_text(len(tokenizer)),
        "vision_config": vision,
        "vocab_size": len(tokenizer),
        "media_placeholder_token_id": pad_id,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|end_of_msg|>")],
    }
    save_model(out, config, seed)
    return out


# --- LocateAnything: a MoonViT with a 2x2 merge, an MLP connector, a Qwen2 LM for boxes and text ----------

LOCATE_TOKENS = ["<IMG_CONTEXT>", "<img>", "</img>", "<box>", "</box>", "<ref>", "</ref>"]
LOCATE_TOKENS += ["<coord_start>", "<coord_end>", "<mask>", "<null>", "<switch>"]


def build_locateanything(out: Path, seed: int) -> Path:
    """mlx-vlm's loader uses the default image processor (14 px patches, 2x2 merge): a 48x40 picture pads
    to 56x56, 4x4 patches, 4 image tokens. The template writes the processor's "<image-N>" marker."""
    tokenizer = save_tokenizer(out, LOCATE_TOKENS, chat_template("<image-1>"))
    ids = token_ids(tokenizer, LOCATE_TOKENS)
    text = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": len(tokenizer)}
    text |= {"text_mask_token_id": ids["<mask>"], "null_token_id": ids["<null>"]}
    text |= {"switch_token_id": ids["<switch>"], "tie_word_embeddings": True}  # sanitize drops lm_head
    vision = {"model_type": "moonvit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"intermediate_size": 64, "patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8}
    config = {"model_type": "locateanything", "text_config": text, "vision_config": vision}
    config |= {"image_token_index": ids["<IMG_CONTEXT>"], "vocab_size": len(tokenizer)}
    config |= {"box_start_token_id": ids["<box>"], "box_end_token_id": ids["</box>"]}
    config |= {"ref_start_token_id": ids["<ref>"], "ref_end_token_id": ids["</ref>"]}
    config |= {"coord_start_token_id": ids["<coord_start>"], "coord_end_token_id": ids["<coord_end>"]}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    # With tied embeddings the residual stream echoes the last token; louder MLPs break the echo
    rescale(out, {"mlp.down_proj.weight": 5.0})
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "kimi_vl": build_kimi_vl,
    "kimi_k25": build_kimi_k25,
    "kimi_k3": build_kimi_k3,
    "locateanything": build_locateanything,
}

NOT_BUILDABLE: dict[str, str] = {}
