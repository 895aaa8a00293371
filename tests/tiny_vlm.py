"""Builds tiny vision-language models with random weights and real processor configs, as model
directories. No small VLM with real weights can be downloaded here; these run the real code paths.

- SmolVLM (mlx-vlm's `smolvlm`: a SigLIP-style vision tower, a pixel-shuffle connector and a Llama
  language model). Images are resized to 32x32 pixels, cut into 8x8 patches (16), and shuffled into 4
  image tokens.
- Qwen2-VL (`qwen2_vl`: a ViT over 14x14 patches, a 2x2 patch merger, and a Qwen2 language model with
  M-RoPE). Images keep their aspect ratio within 56x56..56x112 pixels; every 28x28 area is one image
  token placed on a (time, height, width) position grid.

The tokenizer is the bundled SmolLM2 one plus the model's image tokens, with the model's chat template.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.models.default_model import resolve_model_path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

IMAGE_SEQ_LEN = 4  # image tokens per image: (32 / 8)^2 patches / scale_factor^2
SPECIAL_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def build_tiny_vlm(out: Path, seed: int = 0) -> Path:
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    text_model = resolve_model_path(EngineConfig().model, "float32")
    tokenizer = AutoTokenizer.from_pretrained(text_model)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    vocab_size = len(tokenizer)
    config = _model_config(vocab_size, tokenizer.convert_tokens_to_ids("<image>"))
    config["eos_token_id"] = [tokenizer.convert_tokens_to_ids("<end_of_utterance>"), tokenizer.eos_token_id]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps(_image_processor_config(), indent=1))
    processor = {"processor_class": "SmolVLMProcessor", "image_seq_len": IMAGE_SEQ_LEN}
    (out / "processor_config.json").write_text(json.dumps(processor))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    _save_random_weights(out, config, seed)
    return out


QWEN_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_qwen2_vl(out: Path, seed: int = 0, model_type: str = "qwen2_vl") -> Path:
    """`model_type` "qwen2_5_vl" builds Qwen2.5-VL: the same language model, a windowed vision tower."""
    import importlib

    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(EngineConfig().model, "float32"))
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL_TOKENS})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    config = _qwen2_vl_config(tokenizer, model_type)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps(_qwen2_vl_image_processor_config(), indent=1))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": QWEN_CHAT_TEMPLATE}))
    module = importlib.import_module(f"mlx_vlm.models.{model_type}")
    configs = importlib.import_module(f"mlx_vlm.models.{model_type}.config")
    model_config = module.ModelConfig.from_dict(dict(config))
    model_config.text_config = configs.TextConfig.from_dict(config)
    model_config.vision_config = configs.VisionConfig.from_dict(config["vision_config"])
    _save_weights(out, lambda: module.Model(model_config), seed)
    return out


def _qwen2_vl_config(tokenizer, model_type: str) -> dict:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": len(tokenizer),
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # halves of head_dim 16
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": [tokenizer.convert_tokens_to_ids("<|im_end|>")],
        "vision_config": _qwen_vision_config(model_type),
    }


def _qwen_vision_config(model_type: str) -> dict:
    patches = {"patch_size": 14, "spatial_patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
    if model_type == "qwen2_vl":  # the merger's output `hidden_size` is the language model's width
        return {
            "model_type": model_type,
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "in_channels": 3,
            **patches,
        }
    return {
        "model_type": model_type,
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "in_channels": 3,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        **patches,
    }


def _qwen2_vl_image_processor_config() -> dict:
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": 56 * 56,
        "max_pixels": 56 * 112,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }


def _model_config(vocab_size: int, image_token_id: int) -> dict:
    return {
        "model_type": "smolvlm",
        "architectures": ["SmolVLMForConditionalGeneration"],
        "image_token_id": image_token_id,
        "scale_factor": 2,
        "vocab_size": vocab_size,
        "text_config": {
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "rms_norm_eps": 1e-5,
            "vocab_size": vocab_size,
            "rope_theta": 100000.0,
            "max_position_embeddings": 2048,
        },
        "vision_config": {
            "model_type": "smolvlm_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "patch_size": 8,
            "image_size": 32,
        },
    }


def _image_processor_config() -> dict:
    return {
        "image_processor_type": "Idefics3ImageProcessor",
        "processor_class": "SmolVLMProcessor",
        "do_resize": True,
        "size": {"longest_edge": 32},
        "do_image_splitting": False,
        "max_image_size": {"longest_edge": 32},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_pad": True,
        "do_convert_rgb": True,
        "resample": 2,
    }


def _save_random_weights(out: Path, config: dict, seed: int) -> None:
    from mlx_vlm.models.smolvlm import Model, ModelConfig
    from mlx_vlm.models.smolvlm.config import TextConfig, VisionConfig

    model_config = ModelConfig.from_dict(config)
    model_config.text_config = TextConfig.from_dict(config["text_config"])
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    _save_weights(out, lambda: Model(model_config), seed)


def _save_weights(out: Path, build_model, seed: int) -> None:
    mx.random.seed(seed)  # the model's own initializers draw the random weights
    weights = dict(tree_flatten(build_model().parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def small_engine_config(model_dir: str) -> EngineConfig:
    """Small blocks and token budget: a prompt's image tokens span several blocks and prefill chunks."""
    return EngineConfig(
        model=model_dir, kv_cache_memory_bytes=8 << 20, block_size=4, max_num_batched_tokens=8
    )


def image_prompt(processor, text: str, images: list[bytes]):
    """A user turn with `images` then `text`, rendered by the model's template and processed:
    (prompt ids with image tokens expanded, ImageInputs)."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    rendered = processor.processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return processor.process(rendered, images, max_pixels=10**7)


def png_bytes(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A random RGB picture as PNG bytes; different seeds give different pictures."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()
