"""Tiny random-weight builders for AI2's Molmo, Molmo2 and MolmoPoint. Each builder writes one model
directory (config, random weights, processor files, tokenizer) that mlx-vlm itself loads and generates
from with images; nothing outside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json
from tests.tiny_vlms.weights import redraw, rescale

# --- Molmo: a ViT over 7 px patches, 2x2 attention pooling, an OLMo-style LM; image tokens prepended -------

MOLMO_TOKENS = ["<im_patch>", "<im_col>", "<im_start>", "<im_end>"]


def build_molmo(out: Path, seed: int) -> Path:
    """28x28 px crops of 4x4 patches (7 px) pool 2x2 into 2x2 tokens: a global crop and one tiled crop
    (max_crops 1), 8 feature tokens, 16 with start/end/column markers. The processor puts them before
    the whole prompt, so the template has no image marker; two images become two batch rows."""
    tokenizer = save_tokenizer(out, MOLMO_TOKENS, chat_template(""))
    vocab_size = len(tokenizer)
    text = {
        "model_type": "molmo",
        "d_model": 64,
        "n_heads": 4,
        "n_kv_heads": 2,
        "n_layers": 2,
        "mlp_hidden_size": 256,  # halved by the SwiGLU
        "vocab_size": vocab_size,
        "embedding_size": vocab_size,
        "additional_vocab_size": 8,
        "rope_theta": 10000.0,
    }
    config = {"model_type": "molmo", "text_config": text, "vision_config": _molmo_vision()}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    rescale(out, {"wte.embedding": 50.0, "wte.new_embedding": 50.0, "image_projector.w2": 200.0})
    preprocessor = {
        "max_crops": 1,
        "overlap_margins": [1, 1],
        "base_image_input_size": [28, 28],
        "image_token_length_w": 2,
        "image_token_length_h": 2,
        "image_patch_size": 7,
    }
    write_json(out, "preprocessor_config.json", preprocessor)
    return out


def _molmo_vision() -> dict:
    return {
        "model_type": "molmo",
        "image_default_input_size": [28, 28],
        "image_patch_size": 7,
        "image_pos_patch_size": 7,
        "image_num_pos": 17,  # a class position and 4x4 patch positions
        "hidden_size": 128,  # the projector's SwiGLU width
        "image_emb_dim": 32,
        "image_num_heads": 2,
        "image_num_key_value_heads": 2,
        "image_num_layers": 2,
        "image_head_dim": 16,
        "image_mlp_dim": 64,
        "d_model": 64,
        "vit_layers": [-1, -2],
    }


# --- Molmo2: a ViT, masked attention pooling over 2x2 patch windows, a Qwen3-style LM ----------------------

MOLMO2_TOKENS = [
    "<im_patch>",
    "<im_low>",
    "<im_start>",
    "<low_res_im_start>",
    "<frame_start>",
    "<im_end>",
    "<frame_end>",
    "<im_col>",
    "<|image|>",
]


def build_molmo2(out: Path, seed: int) -> Path:
    """mlx-vlm's loader replaces the processor's image processor with a default Molmo2ImageProcessor()
    (378 px crops of 14 px patches, ignoring preprocessor_config.json), so the tower keeps that geometry
    (27x27 patches a crop) at a tiny width: a 48x40 picture gives a low-res and one high-res crop, each
    pooled 2x2 into 14x14 tokens (392 image tokens)."""
    tokenizer = save_tokenizer(out, MOLMO2_TOKENS, chat_template("<|image|>"))
    ids = token_ids(tokenizer, MOLMO2_TOKENS)
    config = {
        "model_type": "molmo2",
        "text_config": _molmo2_text(len(tokenizer)),
        "vision_config": _molmo2_vision(),
        "image_start_token_id": ids["<im_start>"],
        "low_res_image_start_token_id": ids["<low_res_im_start>"],
        "image_end_token_id": ids["<im_end>"],
        "image_low_res_id": ids["<im_low>"],
        "image_patch_id": ids["<im_patch>"],
        "image_col_id": ids["<im_col>"],
        "frame_start_token_id": ids["<frame_start>"],
        "frame_end_token_id": ids["<frame_end>"],
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    save_model(out, config, seed)
    redraw(out, ["wte.embedding", "wte.new_embedding"], seed)
    rescale(out, {"image_projector.w2": 1000.0})  # image features as large as the token embeddings
    preprocessor = {"size": {"height": 378, "width": 378}, "patch_size": 14, "pooling_size": [2, 2]}
    write_json(out, "preprocessor_config.json", preprocessor)
    return out


def _molmo2_text(vocab_size: int) -> dict:
    return {
        "model_type": "molmo2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": vocab_size,
        "additional_vocab_size": 8,
        "rope_theta": 10000.0,
    }


def _molmo2_vision() -> dict:
    vit = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "image_patch_size": 14,
        "image_num_pos": 729,
        "image_default_input_size": [378, 378],
    }
    adapter = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "text_hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vit_layers": [-1, -2],
    }
    return {"vit_config": vit, "adapter_config": adapter}


# --- MolmoPoint: Molmo2's tower and pooling, a Molmo2 LM with point-prediction heads --------------------

MOLMO_POINT_TOKENS = [*MOLMO2_TOKENS, "<im_nonindex>", "<patch>", "<subpatch>", "<location>"]


def build_molmo_point(out: Path, seed: int) -> Path:
    """Like Molmo2 (mlx-vlm's loader forces the default 378 px / 14 px image processor), plus the
    point predictor. Generation runs through Model.__call__, which keeps an image cache for pointing."""
    tokenizer = save_tokenizer(out, MOLMO_POINT_TOKENS, chat_template("<|image|>"))
    ids = token_ids(tokenizer, MOLMO_POINT_TOKENS)
    molmo2_vision = _molmo2_vision()
    adapter = molmo2_vision["adapter_config"] | {"model_type": "molmo_point", "hidden_act": "silu"}
    config = {"model_type": "molmo_point", "vision_config": molmo2_vision["vit_config"]}
    config |= {"text_config": _molmo2_text(len(tokenizer)) | {"model_type": "molmo2_text"}}
    config |= {"adapter_config": adapter, "patch_embed_dim": 32}
    config |= {
        "image_start_token_id": ids["<im_start>"],
        "image_end_token_id": ids["<im_end>"],
        "image_patch_id": ids["<im_patch>"],
        "image_high_res_id": ids["<im_patch>"],
        "image_col_id": ids["<im_col>"],
        "image_non_indexable_patch_id": ids["<im_low>"],
        "frame_start_token_id": ids["<frame_start>"],
        "frame_end_token_id": ids["<frame_end>"],
        "patch_token_id": ids["<patch>"],
        "subpatch_token_id": ids["<subpatch>"],
        "location_token_id": ids["<location>"],
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
    }
    save_model(out, config, seed)
    # the class draws token and output embeddings as zeros
    redraw(out, ["wte.embedding", "wte.new_embedding", "output_embeddings"], seed)
    rescale(out, {"image_projector.w2": 1000.0})  # image features as large as the token embeddings
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "molmo": build_molmo,
    "molmo2": build_molmo2,
    "molmo_point": build_molmo_point,
}

NOT_BUILDABLE: dict[str, str] = {}
