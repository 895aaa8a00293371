"""Builds a tiny SmolVLM (mlx-vlm's `smolvlm` architecture: a SigLIP-style vision tower, a pixel-shuffle
connector and a Llama language model) with random weights and a real processor config, as a model
directory. No small VLM with real weights can be downloaded here; this one runs the real code paths.

The tokenizer is the bundled SmolLM2 one plus SmolVLM's image tokens, with SmolVLM's chat template.
Images are resized to 32x32 pixels, cut into 8x8 patches (16), and shuffled into 4 image tokens.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.default_model import resolve_model_path

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
    mx.random.seed(seed)
    model = Model(model_config)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def png_bytes(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A random RGB picture as PNG bytes; different seeds give different pictures."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()
