"""Turns a rendered chat prompt and its images' bytes into model inputs, through the model's mlx-vlm
processor and mlx-vlm's own `prepare_inputs` (which knows each processor's call signature): decoded and
checked images, expanded image tokens, pixel arrays, the processor's other outputs (attention mask,
token types, grids) and the images' content hash.

Runs where the tokenizer runs (the Tokenizer deployment), never on the Scheduler. Owns image decoding
and its limits; a request it cannot take raises `InvalidRequestError` naming what to change.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError
from engine.messages import ImageInputs
from engine.models.vision_config import image_token_id

import numpy as np
from PIL import Image, UnidentifiedImageError


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

    def __init__(self, processor: Any, model_type: str, image_token_id: int | None):
        self.processor = processor
        self.model_type = model_type
        self.image_token_id = image_token_id

    @classmethod
    def load(cls, path: str) -> ImagePreprocessor:
        from mlx_vlm.utils import get_model_and_args, load_config, load_image_processor, load_processor

        config = load_config(Path(path))
        get_model_and_args(config)  # imports the model module, which registers its processor
        processor = load_processor(Path(path), add_detokenizer=False)
        if (image_processor := load_image_processor(Path(path))) is not None:
            processor.image_processor = image_processor
        return cls(processor, config.get("model_type", ""), image_token_id(config))

    @property
    def chat_template(self) -> str | None:
        return getattr(self.processor, "chat_template", None)

    def process(self, text: str, images: list[bytes], max_pixels: int) -> tuple[list[int], ImageInputs]:
        """The prompt's ids with each image placeholder expanded, and the images' model inputs."""
        from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

        decoded = [decode_image(data, i + 1, max_pixels) for i, data in enumerate(images)]
        try:
            outputs = prepare_inputs(
                self.processor,
                images=decoded,
                prompts=text,
                image_token_index=self.image_token_id,
                add_special_tokens=should_add_special_tokens(self.model_type, self.processor),
            )
        except ValueError as exc:  # e.g. the template rendered fewer image placeholders than images
            outputs = self._call_plainly(decoded, text, exc)
        ids = np.array(outputs.pop("input_ids")).reshape(-1).tolist()
        pixels = as_numpy(outputs.pop("pixel_values"))
        extras = {name: as_numpy(value) for name, value in outputs.items() if value is not None}
        return ids, ImageInputs(pixels, extras, images_hash(images), len(images))

    def _call_plainly(self, decoded: list[Any], text: str, first: ValueError) -> dict[str, Any]:
        """The processor called with images and text alone: some (LLaVA's with transformers 5) pass
        mlx-vlm's text options on to image processors that refuse them."""
        try:
            return dict(self.processor(images=decoded, text=[text]))
        except (ValueError, TypeError):
            raise InvalidRequestError(f"the images do not fit the prompt: {first}", "messages") from first


def as_numpy(value: Any) -> Any:
    """MLX arrays (and lists of them) as NumPy ones, which pickle across actors; other values as they are."""
    if isinstance(value, list):
        return [as_numpy(v) for v in value]
    if hasattr(value, "__array__") and not isinstance(value, np.ndarray):
        array = np.array(value)
        return array.astype(np.float32) if array.dtype.kind == "f" else array
    return value


def as_content_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """VLM chat templates iterate over content parts (`{"type": "text"|"image", ...}`); a plain string
    content would render as nothing, so strings become one text part."""
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
