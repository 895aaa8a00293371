"""What the tiny VLM builders share: the bundled SmolLM2 tokenizer cut to its first 512 ids (as the tiny
text models', tests/tiny_text_model.py) with a model's special tokens and chat template, random weights
drawn by mlx-vlm's own model class, and test pictures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)

import mlx.core as mx
from mlx.utils import tree_flatten

from tests.tiny_text_model import VOCAB_SIZE, save_cut_tokenizer
from tests.tiny_vlm import png_bytes

__all__ = ["png_bytes", "save_model", "save_tokenizer", "write_json"]

# Chat template for content-part messages: `image_marker` is what the model's processor expects for
# one image in the text (it expands it into the image tokens).
CONTENT_PARTS_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}IMAGE_MARKER"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_template(image_marker: str) -> str:
    return CONTENT_PARTS_TEMPLATE.replace("IMAGE_MARKER", image_marker)


def save_tokenizer(
    out: Path,
    special_tokens: list[str],
    template: str,
    named_tokens: dict[str, str] | None = None,
    **extra: Any,
):
    """The bundled SmolLM2 tokenizer's first 512 ids plus `special_tokens` (new ones from id 512 on), saved
    to `out` with `template`; returns it. A model's vocab_size is its length: about 520 rather than 49,160
    makes loading the tokenizer, the processor and the weights, and every forward, cheaper (the vision
    conformance test went from 218 s to 53 s).
    `named_tokens` (e.g. {"image_token": "<image>"}) become tokenizer attributes, as processors read them."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    save_cut_tokenizer(out, VOCAB_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": special_tokens})
    tokenizer.chat_template = template
    for name, value in extra.items():
        setattr(tokenizer, name, value)
    tokenizer.save_pretrained(out)
    if named_tokens:
        config_file = out / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["extra_special_tokens"] = named_tokens
        config_file.write_text(json.dumps(config, indent=1))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    return tokenizer


def write_json(out: Path, name: str, data: dict) -> None:
    (out / name).write_text(json.dumps(data, indent=1))


def save_model(out: Path, config: dict, seed: int) -> None:
    """Writes config.json and random weights drawn by the model's own mlx-vlm class, configured the way
    mlx-vlm's loader configures it."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    write_json(out, "config.json", config)
    module, _ = get_model_and_args(config=dict(config))
    full = json.loads(json.dumps(config))
    full.setdefault("text_config", full.pop("llm_config", {}))
    full.setdefault("vision_config", {})
    full.setdefault("audio_config", {})
    model_config = module.ModelConfig.from_dict(full)
    model_config = update_module_configs(
        model_config, module, full, ["text", "vision", "perceiver", "projector", "audio"]
    )
    mx.random.seed(seed)  # the model's own initializers draw the weights
    weights = dict(tree_flatten(module.Model(model_config).parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def token_ids(tokenizer, tokens: list[str]) -> dict[str, int]:
    """Each of `tokens` with its id."""
    return {token: tokenizer.convert_tokens_to_ids(token) for token in tokens}


def ids(tokenizer, *tokens: str) -> list[int]:
    """The ids of `tokens`, in order."""
    return [tokenizer.convert_tokens_to_ids(token) for token in tokens]


def save_named_tokenizer(out: Path, named: dict[str, str], template: str, extra: tuple[str, ...] = ()):
    """`save_tokenizer` whose `named` tokens (e.g. image_token -> "<image>") load back as attributes."""
    tokenizer = save_tokenizer(out, list(dict.fromkeys([*named.values(), *extra])), template)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["extra_special_tokens"] = named
    config_path.write_text(json.dumps(config, indent=1))
    return tokenizer
