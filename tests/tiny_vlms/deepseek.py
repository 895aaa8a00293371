"""Tiny random-weight builders for DeepSeek's vision models: DeepSeek-VL (multi_modality), DeepSeek-V4.1
and DeepSeek-VL2 (its builder is left out of BUILDERS: see NOT_BUILDABLE), and why the DeepSeek-OCR
models cannot be tiny. Each builder writes one model directory (config, random weights, processor files,
tokenizer) that mlx-vlm itself loads and generates from with images; nothing outside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, write_json
from tests.tiny_vlms.weights import redraw

# --- DeepSeek-VL2: a SigLIP tower, a 2x2 downsampling MLP, a DeepSeek-V2 (MLA + MoE) LM --------------------

DEEPSEEK_VL2_TOKENS = [
    "<image>",
    "<｜▁pad▁｜>",
    "<|ref|>",
    "<|/ref|>",
    "<|det|>",
    "<|/det|>",
    "<|grounding|>",
    "<|User|>",
    "<|Assistant|>",
]


def build_deepseek_vl_v2(out: Path, seed: int) -> Path:
    """Not in BUILDERS (see NOT_BUILDABLE): runs only with a string prompt that holds "<image>".
    One 32x32 tile size: a global view and one local tile of 4x4 patches (8 px), each downsampled 2x2
    and laid out with newline embeddings, 13 image tokens per image."""
    tokenizer = save_tokenizer(out, DEEPSEEK_VL2_TOKENS, chat_template("<image>"))
    vision = {"model_type": "vision", "layers": 2, "width": 32, "intermediate_size": 64}
    vision |= {"num_attention_heads": 2, "image_size": 32, "patch_size": 8, "mlp_ratio": 2.0}
    projector = {"projector_type": "downsample_mlp_gelu", "input_dim": 32, "n_embed": 64}
    config = {
        "model_type": "deepseek_vl_v2",
        "text_config": _deepseek_v2_text(len(tokenizer)),
        "vision_config": vision,
        "projector_config": projector | {"depth": 2, "mlp_ratio": 1, "downsample_ratio": 2},
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "pad_id": tokenizer.convert_tokens_to_ids("<｜▁pad▁｜>"),
        "tile_tag": "2D",
        "global_view_pos": "head",
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    save_model(out, config, seed)
    processor = {"candidate_resolutions": [[32, 32]], "patch_size": 8, "downsample_ratio": 2}
    write_json(out, "processor_config.json", processor | {"image_token": "<image>"})
    return out


def _deepseek_v2_text(vocab_size: int) -> dict:
    """Multi-head latent attention, then one dense layer and one MoE layer (4 experts, 2 a token)."""
    return {
        "model_type": "deepseek_v2",
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
        "first_k_dense_replace": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "max_position_embeddings": 4096,
    }


# --- DeepSeek-VL (multi_modality): a SigLIP tower, an MLP aligner, a Llama LM ---------------------------


def build_multi_modality(out: Path, seed: int) -> Path:
    """mlx-vlm's ImageProcessor(config) resizes to 384 px (fixed without a hybrid tower), so 48 px patches
    give 8x8 = 64 image tokens; the model itself widens each "<image>" token into them."""
    tokenizer = save_tokenizer(out, ["<image>"], chat_template("<image>"))
    text = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": len(tokenizer)}
    # width >= patch size, else the loader's sanitize takes the conv weight for a PyTorch one
    vision = {"model_type": "vision", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 64}
    vision |= {"num_attention_heads": 2, "image_size": 384, "patch_size": 48, "cls": "", "params": {}}
    aligner = {"cls": "MlpProjector", "model_type": "aligner"}
    aligner["params"] = {"projector_type": "mlp_gelu", "depth": 2}
    config = {"model_type": "multi_modality", "text_config": text, "vision_config": vision}
    config |= {"projector_config": aligner, "num_image_tokens": 64, "vocab_size": len(tokenizer)}
    config |= {"image_token_index": tokenizer.convert_tokens_to_ids("<image>")}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    return out


# --- DeepSeek-V4.1: a ViT with a 3x3 aligner, a DeepSeek-V4-style LM (hyper-connections, MoE) -------------

DEEPSEEK_V41_TOKENS = ["<｜deepseek_image｜>", "<｜User｜>", "<｜Assistant｜>"]


def build_deepseek_v41(out: Path, seed: int) -> Path:
    """A 48x40 picture keeps its size rounded up to 14 px patches (4x3), which the aligner merges 3x3 into
    2x1 tokens laid out with newline, start and end embeddings: 6 image positions. No engram tables,
    no KV compression, no indexer."""
    tokenizer = save_tokenizer(out, DEEPSEEK_V41_TOKENS, chat_template("<｜deepseek_image｜>"))
    config = {"model_type": "deepseek_v41", **_deepseek_v41_text(len(tokenizer))}
    config |= {"image_token_id": tokenizer.convert_tokens_to_ids("<｜deepseek_image｜>")}
    config |= {"bos_token_id": tokenizer.bos_token_id}
    config |= {"eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")}
    config["vision_config"] = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2}
    config["vision_config"] |= {"intermediate_size": 64, "patch_size": 14, "downsample_ratio": 3}
    config["vision_config"] |= {"min_pixels": 0, "max_image_tokens": 64}
    save_model(out, config, seed)
    # the class draws these as zeros: output head, routers, hyper-connection mixers, image markers
    zeros = ["head.weight", "gate.weight", "hc_attn_fn", "hc_ffn_fn"]
    redraw(out, [*zeros, "image_start", "image_end", "image_newline"], seed, std=0.2)
    return out


def _deepseek_v41_text(vocab_size: int) -> dict:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "qk_rope_head_dim": 8,
        "q_lora_rank": 32,
        "o_lora_rank": 32,
        "o_groups": 2,
        "rms_norm_eps": 1e-6,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
        "compress_ratios": [0, 1],  # layer 0 sliding-window only, layer 1 adds uncompressed KV latents
        "kv_source_layer_ids": [1],
        "index_source_layer_ids": [],
        "candidate_source_layer_id": -1,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 8,
        "hc_mult": 2,
        "engram_layer_ids": [],
        "engram_num_embeddings": [],
    }


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "multi_modality": build_multi_modality,
    "deepseek_v41": build_deepseek_v41,
}

NOT_BUILDABLE: dict[str, str] = {
    "deepseek_vl_v2": "DeepseekVLV2Processor ignores the saved chat template for its built-in one, which "
    "prints content parts as a Python list (no <image>: AssertionError in tokenize_with_images); with "
    "string prompts build_deepseek_vl_v2 runs, but repeated get_input_embeddings calls on the same inputs "
    "stop inserting the image features",
    "deepseekocr": "SAMEncoder is built from the fixed SAMViTConfig() (SAM-B: 768 wide, 12 layers, 1024 px, "
    "~90M params) whatever config.json says, and the processor forces 1024 px views; cannot be tiny",
    "deepseekocr_2": "same fixed SAMViTConfig() SAM-B encoder (plus a Qwen2 encoder) as deepseekocr; "
    "cannot be tiny",
    "unlimited_ocr": "subclasses DeepseekOCR's Model, so it builds the same fixed SAMViTConfig() SAM-B "
    "encoder (768 wide, 12 layers, 1024 px); cannot be tiny",
}
