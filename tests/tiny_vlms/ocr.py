"""Tiny random-weight builders for OCR and document-reading models: Florence-2, GOT-OCR 2.0, Nemotron-Parse
and Falcon-OCR (its builder is left out of BUILDERS: see NOT_BUILDABLE), and why Falcon Perception,
dots.ocr and PaddleOCR-VL cannot be built here. Each builder writes one model directory (config, random
weights, processor files, tokenizer) that mlx-vlm itself loads and generates from with images; nothing
outside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms.common import chat_template, save_model, save_tokenizer, token_ids, write_json
from tests.tiny_vlms.weights import redraw, rescale

# --- Florence-2: a DaViT tower, pooled image features before the prompt, a BART encoder-decoder -----------

FLORENCE2_TASK_TOKENS = [
    "</od>",
    "<ocr>",
    "</ocr>",
    *(f"<loc_{i}>" for i in range(1000)),
    *("<cap>", "</cap>", "<ncap>", "</ncap>", "<dcap>", "</dcap>", "<grounding>", "</grounding>"),
    *("<seg>", "</seg>", "<sep>", "<region_cap>", "</region_cap>", "<region_to_desciption>"),
    *("</region_to_desciption>", "<proposal>", "</proposal>", "<poly>", "</poly>", "<and>"),
]


def build_florence2(out: Path, seed: int) -> Path:
    """32x32 px images through two DaViT stages (stride 4, then 2) give a 4x4 map: 16 spatial tokens and
    one pooled token lead the encoder input. The processor itself puts the image tokens (dropped again
    by the model) before the prompt; mlx-vlm's patch adds the task tokens, which the tokenizer holds
    already so the vocabulary matches."""
    special = ["<image>", *FLORENCE2_TASK_TOKENS, "<florence_image>"]
    tokenizer = save_tokenizer(out, special, chat_template(""))
    image_id = tokenizer.convert_tokens_to_ids("<florence_image>")
    text = {"d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 4}
    text |= {"encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_layers": 1, "decoder_layers": 1}
    text |= {"vocab_size": len(tokenizer), "max_position_embeddings": 1024}
    text |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    text |= {"pad_token_id": tokenizer.eos_token_id, "decoder_start_token_id": tokenizer.eos_token_id}
    config = {"model_type": "florence2", "text_config": text, "vision_config": _davit_tiny()}
    config |= {"vocab_size": len(tokenizer), "image_token_id": image_id, "image_token_index": image_id}
    config |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": [tokenizer.eos_token_id]}
    config["image_pos_embed"] = {"type": "learned_abs_2d", "max_pos_embeddings": 8}
    save_model(out, config, seed)
    redraw(out, ["image_projection"], seed, std=0.2)  # drawn as zeros by the class
    write_json(out, "preprocessor_config.json", _florence2_image_processor())
    return out


def _davit_tiny() -> dict:
    return {
        "model_type": "davit",
        "depths": [1, 1],
        "dim_embed": [16, 32],
        "num_heads": [1, 2],
        "num_groups": [1, 2],
        "window_size": 2,
        "mlp_ratio": 2.0,
        "patch_size": [7, 3],
        "patch_stride": [4, 2],
        "patch_padding": [3, 1],
        "patch_prenorm": [False, False],
        "hidden_size": 32,
        "image_size": [32, 32],
    }


def _florence2_image_processor() -> dict:
    return {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "Florence2Processor",
        "image_seq_length": 17,
        "size": {"height": 32, "width": 32},
        "crop_size": {"height": 32, "width": 32},
        "do_resize": True,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "do_convert_rgb": True,
    }


# --- GOT-OCR 2.0: a SAM-style windowed ViT, two stride-2 convs, a Qwen2 LM --------------------------------

# The processor wraps the prompt in its own conversation unless the text already holds <|im_end|>, so
# this template has no role markup: "<image>" (expanded to 256 pads) then the text.
GOT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def build_got(out: Path, seed: int) -> Path:
    """The processor always resizes to 1024 px and writes 256 image pads, so the tower keeps 16 px
    patches (a 64x64 grid, 8x8 windows) that two stride-2 convs bring to 16x16 tokens, at width 16."""
    tokenizer = save_tokenizer(out, ["<img>", "</img>", "<imgpad>"], GOT_TEMPLATE)
    ids = token_ids(tokenizer, ["<img>", "</img>", "<imgpad>"])
    vision = {"img_size": 1024, "patch_size": 16, "embed_dim": 16, "depth": 1, "num_heads": 2}
    vision |= {"mlp_ratio": 2.0, "out_chans": 16, "out_dim": 32, "window_size": 8, "global_attn_indexes": []}
    config = {"model_type": "got", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    config |= {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    config |= {"vocab_size": len(tokenizer), "vision_config": vision, "im_patch_token": ids["<imgpad>"]}
    config |= {"im_start_token": ids["<img>"], "im_end_token": ids["</img>"]}
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    save_model(out, config, seed)
    # Token embeddings (std 0.1) well above the constant attention biases, image features alike, and
    # sharper attention, else the 256 image tokens average out
    scales = {"embed_tokens": 10.0, "multi_modal_projector.weight": 10.0}
    rescale(out, scales | {"self_attn.q_proj.weight": 3.0, "self_attn.k_proj.weight": 3.0})
    return out


# --- Nemotron-Parse: a C-RADIO ViT with a 4x horizontal neck, an mBART decoder (image-to-text only) --------


def build_nemotron_parse(out: Path, seed: int) -> Path:
    """The processor always pads (never enlarges) a picture onto a 2048x1664 white canvas, so the tower
    uses 64 px patches (32x26) and the neck keeps 32x6 tokens plus one summary token. The decoder starts
    from decoder_start_token_id: the text prompt is ignored."""
    tokenizer = save_tokenizer(out, [], chat_template(""))
    vision = {"hidden_size": 32, "num_heads": 2, "mlp_ratio": 2.0, "num_layers": 1, "patch_size": 64}
    vision |= {"neck_dim": 64, "image_size": [2048, 1664], "final_size": [2048, 1664]}
    text = {"d_model": 64, "decoder_attention_heads": 4, "decoder_ffn_dim": 128, "decoder_layers": 1}
    text |= {"vocab_size": len(tokenizer), "max_position_embeddings": 1024}
    text |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    text |= {"pad_token_id": tokenizer.eos_token_id, "decoder_start_token_id": tokenizer.bos_token_id}
    # "encoder"/"decoder" as in the checkpoints, and vision_config, which mlx-vlm's loader reads
    config = {"model_type": "nemotron_parse", "encoder": vision, "decoder": text}
    config |= {"vision_config": vision, "vocab_size": len(tokenizer)}
    config |= {"decoder_start_token_id": tokenizer.bos_token_id, "eos_token_id": [tokenizer.eos_token_id]}
    save_model(out, config, seed)
    # The picture fills 1-2 of the 193 encoder tokens: sharp cross-attention lets it show
    rescale(out, {"encoder_attn.q_proj.weight": 6.0, "encoder_attn.k_proj.weight": 6.0})
    return out


# --- Falcon-OCR: raw 16 px patches projected into the LM (no vision tower), 2-D RoPE on image tokens -----

FALCON_TOKENS = ["<|image|>", "<|img_end|>", "<|image_cls|>", "<|image_reg_1|>", "<|image_reg_2|>"]
FALCON_TOKENS += ["<|image_reg_3|>", "<|image_reg_4|>", "<|OCR_PLAIN|>"]


def build_falcon_ocr(out: Path, seed: int) -> Path:
    """Not in BUILDERS (see NOT_BUILDABLE): runs only with string message content. Pictures resize to
    at least 64 px (64x64 here): 4x4 patches of 16 px, 16 image tokens after a class and four register
    tokens. The processor replaces the whole prompt with its OCR instruction."""
    tokenizer = save_tokenizer(out, FALCON_TOKENS, chat_template(""))
    ids = token_ids(tokenizer, FALCON_TOKENS)
    config = {"model_type": "falcon_ocr", "dim": 64, "n_layers": 2, "n_heads": 4, "head_dim": 16}
    config |= {"n_kv_heads": 2, "ffn_dim": 128, "vocab_size": len(tokenizer), "spatial_patch_size": 16}
    config |= {"img_id": ids["<|image|>"], "img_end_id": ids["<|img_end|>"]}
    config |= {"image_cls_token_id": ids["<|image_cls|>"], "eos_id": tokenizer.eos_token_id}
    config |= {f"image_reg_{i}_token_id": ids[f"<|image_reg_{i}|>"] for i in range(1, 5)}
    config["eos_token_id"] = [tokenizer.eos_token_id]
    save_model(out, config, seed)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "florence2": build_florence2,
    "got": build_got,
    "nemotron_parse": build_nemotron_parse,
}

NOT_BUILDABLE: dict[str, str] = {
    "falcon_ocr": "FalconOCRProcessor.apply_chat_template passes each message's content to "
    "make_ocr_prompt, which needs a string: content parts raise AttributeError: 'list' object has no "
    "attribute 'strip' (build_falcon_ocr runs with string content)",
    "falcon_perception": "not a text generator: referring-expression detection and segmentation "
    "(box centres, sizes and masks decoded by generate_perception)",
    "paddleocr_vl": "its vision projector's output width is hard-coded to 1024 (PaddleOCRProjector "
    "context_dim=1024), so the language model must be 1024 wide, not tiny",
    "dots_ocr": "DotsVLProcessor hard-codes image_token_id 151665 (and checks its count in input_ids), so "
    "the image token must sit at id 151665: a 151k-token vocabulary, not tiny",
}
