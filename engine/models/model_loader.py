"""Loads a model and its tokenizer through mlx-lm (or mlx-vlm for a vision-language model, see
engine/models/vision_model.py), on the configured MLX device and dtype.

Owns device and dtype choice and context-length discovery; never allocates the KV cache.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import DEFAULT_MODEL, EngineConfig, source_name
from engine.errors import ModelLoadError, load_cause
from engine.models.default_model import resolve_model_path
from engine.models.vision_config import is_vision_config
from engine.models.vision_model import load_vision_model
from engine.prompt.image_processor import ImagePreprocessor

import mlx.core as mx
from mlx import nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer_at
from mlx_lm.utils import load as mlx_lm_load

logger = logging.getLogger(__name__)

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    name: str
    path: str
    dtype: mx.Dtype
    context_len: int | None
    device: str  # MLX's device type it runs on: "cpu" or "gpu"
    image_token_id: int | None = None  # set for a vision-language model (engine/models/vision_model.py)
    accepts_images: bool = False  # a vision-language model (it may name no image token)


def select_device(config: EngineConfig) -> mx.Device:
    if config.device == "cpu":
        device = mx.Device(mx.cpu)
    elif config.device == "gpu":
        if not mx.is_available(mx.gpu):
            raise ValueError(
                "device 'gpu' was asked for but MLX sees none; install the `cuda` extra on an NVIDIA "
                "machine, or set device to 'auto' or 'cpu'"
            )
        device = mx.Device(mx.gpu)
    else:  # MLX's default is the GPU (Metal or CUDA) when one is present, else the CPU
        device = mx.default_device()
    mx.set_default_device(device)
    return device


def resolve_dtype(config: EngineConfig, device: mx.Device) -> str:
    if config.dtype != "auto":
        return config.dtype
    # On the CPU only float32 matmuls go through BLAS; half precision decodes ~5x slower there.
    return "float32" if device == mx.Device(mx.cpu) else "bfloat16"


def model_path(config: EngineConfig, dtype: str) -> str:
    return resolve_model_path(config.model, dtype)


def model_name(config: EngineConfig, path: str) -> str:
    return source_name(config.model)


def load_model(config: EngineConfig) -> LoadedModel:
    try:
        return _load_model(config)
    except Exception as exc:
        raise _load_error(config, exc) from exc


def _load_error(config: EngineConfig, exc: Exception) -> ModelLoadError:
    """One line for the replica's log and `serve status`: which model, why, and what to change."""
    return ModelLoadError(
        f"could not load model {config.model!r}: {load_cause(config.model, exc)}. Set engine.model in "
        f"serve_config.yaml to an mlx-lm model directory, a Hugging Face hub id or {DEFAULT_MODEL!r}"
    )


def _load_model(config: EngineConfig) -> LoadedModel:
    device = select_device(config)
    dtype = resolve_dtype(config, device)
    path = model_path(config, dtype)
    set_dtype = config.dtype != "auto" or device == mx.Device(mx.cpu)
    model_config = read_model_config(path)
    if is_vision_config(model_config):
        return _load_vision(config, local_model_dir(path), model_config, dtype, set_dtype, device)
    model, tokenizer = mlx_lm_load(path)
    if set_dtype:
        model.set_dtype(_DTYPES[dtype])
    mx.eval(model.parameters())
    logger.info("loaded %s on %s as %s", path, device, dtype)
    name, context_len, kind = model_name(config, path), _context_len(path), device.type.name
    return LoadedModel(model, tokenizer, name, path, _DTYPES[dtype], context_len, kind)


def _load_vision(
    config: EngineConfig, path: str, model_config: dict, dtype: str, set_dtype: bool, device: mx.Device
) -> LoadedModel:
    model, tokenizer = load_vision_model(
        path, model_config, _DTYPES[dtype], set_dtype, config.encoder_cache_bytes
    )
    name, context_len, kind = model_name(config, path), _context_len(path), device.type.name
    dtype_ = _DTYPES[dtype]
    return LoadedModel(model, tokenizer, name, path, dtype_, context_len, kind, model.image_token_id, True)


def load_tokenizer(config: EngineConfig) -> TokenizerWrapper:
    """The tokenizer alone, for processes that never run the model."""
    try:
        path = Path(model_path(config, resolve_dtype(config, mx.default_device())))
        if not path.exists():
            from huggingface_hub import snapshot_download

            patterns = ["*.json", "*.model", "*.txt", "*.jinja"]
            path = Path(snapshot_download(config.model, allow_patterns=patterns))
        return load_tokenizer_at(path)
    except Exception as exc:
        raise _load_error(config, exc) from exc


def read_model_config(path: str) -> dict:
    """The checkpoint's config.json, from the directory or (for a hub id) downloaded alone."""
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        from huggingface_hub import hf_hub_download

        config_file = Path(hf_hub_download(path, "config.json"))
    return json.loads(config_file.read_text())


def local_model_dir(path: str) -> str:
    """A local directory for the model: `path` itself, or the hub snapshot of its weights and configs."""
    if Path(path).exists():
        return path
    from mlx_vlm.utils import get_model_path

    return str(get_model_path(path))


def is_vision_model(config: EngineConfig) -> bool:
    """Whether the configured model is a vision-language model (mlx-vlm), from its config.json alone."""
    return is_vision_config(read_model_config(model_path(config, resolve_dtype(config, mx.default_device()))))


def _context_len(path: str) -> int | None:
    config = read_model_config(path)
    text_config = config.get("text_config", config)
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(text_config.get(key), int):
            return text_config[key]
    return None


def load_image_preprocessor(config: EngineConfig, tokenizer: Any) -> ImagePreprocessor | None:
    """The processor of a vision-language model, None for a text-only one. A VLM whose tokenizer files
    carry no chat template gets the processor's (SmolVLM keeps it in chat_template.json)."""
    if not is_vision_model(config):
        return None
    path = local_model_dir(model_path(config, resolve_dtype(config, mx.default_device())))
    preprocessor = ImagePreprocessor.load(path)
    if not getattr(tokenizer, "chat_template", None) and preprocessor.chat_template:
        getattr(tokenizer, "_tokenizer", tokenizer).chat_template = preprocessor.chat_template
    return preprocessor
