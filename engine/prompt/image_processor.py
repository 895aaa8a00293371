"""Turns a rendered chat prompt and its images' bytes into model inputs, through the model's mlx-vlm
processor: decoded and checked images, expanded image tokens, pixel arrays and the images' content hash.

Runs where the tokenizer runs (the Tokenizer deployment), never on the Scheduler. Owns image decoding
and its limits; a request it cannot take raises `InvalidRequestError` naming what to change.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.messages import ImageInputs

import numpy as np
from PIL import Image, UnidentifiedImageError

# Processor outputs the engine rebuilds itself (ids) or never needs (the text attention mask).
_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def decode_image(data: bytes, index: int, max_pixels: int) -> Image.Image:
    """One image's bytes -> an RGB image; `index` numbers it (from 1) in error messages."""
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size  # read from the header, before any pixel is decoded
        if width * height > max_pixels:
            raise InvalidRequestError(
                f"image {index} is {width}x{height} pixels, above the limit of {max_pixels}; send a smaller image",
                "messages",
            )
        image.load()
        return image.convert("RGB")
    except InvalidRequestError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequestError(
            f"image {index} could not be decoded as an image ({type(exc).__name__}); send a PNG, JPEG, "
            "GIF or WebP image",
            "messages",
        ) from exc


def images_hash(images: list[bytes]) -> str:
    digest = hashlib.sha256()
    for data in images:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


class ImagePreprocessor:
    """The model's processor (tokenizer plus image processor) as mlx-vlm loads it."""

    def __init__(self, processor: Any):
        self.processor = processor

    @classmethod
    def load(cls, path: str) -> ImagePreprocessor:
        from mlx_vlm.utils import get_model_and_args, load_config, load_image_processor, load_processor

        get_model_and_args(load_config(Path(path)))  # imports the model module, which registers its processor
        processor = load_processor(Path(path), add_detokenizer=False)
        if (image_processor := load_image_processor(Path(path))) is not None:
            processor.image_processor = image_processor
        return cls(processor)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.processor, "chat_template", None)

    def process(self, text: str, images: list[bytes], max_pixels: int) -> tuple[list[int], ImageInputs]:
        """The prompt's ids with each image placeholder expanded, and the images' pixel arrays."""
        decoded = [decode_image(data, i + 1, max_pixels) for i, data in enumerate(images)]
        try:
            outputs = self.processor(images=decoded, text=[text], add_special_tokens=False)
        except ValueError as exc:  # e.g. the template rendered fewer image placeholders than images
            raise InvalidRequestError(f"the images do not fit the prompt: {exc}", "messages") from exc
        arrays = {name: np.array(value) for name, value in outputs.items()}
        extras = {name: value for name, value in arrays.items() if name not in (*_TEXT_KEYS, "pixel_values")}
        ids = arrays["input_ids"].reshape(-1).tolist()
        pixels = arrays["pixel_values"].astype(np.float32)
        return ids, ImageInputs(pixels, extras, images_hash(images), len(images))


def load_image_preprocessor(config: EngineConfig, tokenizer: Any) -> ImagePreprocessor | None:
    """The processor of a vision-language model, None for a text-only one. A VLM whose tokenizer files
    carry no chat template gets the processor's (SmolVLM keeps it in chat_template.json)."""
    from engine.models.model_loader import is_vision_model, local_model_dir, model_path, resolve_dtype

    if not is_vision_model(config):
        return None
    import mlx.core as mx

    path = local_model_dir(model_path(config, resolve_dtype(config, mx.default_device())))
    preprocessor = ImagePreprocessor.load(path)
    if not getattr(tokenizer, "chat_template", None) and preprocessor.chat_template:
        getattr(tokenizer, "_tokenizer", tokenizer).chat_template = preprocessor.chat_template
    return preprocessor


def as_content_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """VLM chat templates iterate over content parts (`{"type": "text"|"image", ...}`); a plain string
    content would render as nothing, so strings become one text part."""
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
