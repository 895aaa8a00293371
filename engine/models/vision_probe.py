"""The load-time probe of a vision-language model: one small picture through the model's own processor
and `get_input_embeddings` tells which vision inputs the model feeds its language model (DeepStack
features, M-RoPE positions, cross-attention states, ...), so the engine serves it or refuses it by name
before any request arrives. Owns nothing after load; never runs the language model.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

PROBE_TEXT = "Describe the picture."


def probe_picture(seed: int = 0, size: tuple[int, int] = (64, 48)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def render_user_turn(processor: Any, text: str, num_images: int) -> str:
    """One user turn with `num_images` images then `text`, through the model's chat template (the
    processor's where it has one, else the tokenizer's); without a template, the processor's image token."""
    content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": text}]
    rendered = render_messages(processor, [{"role": "user", "content": content}])
    if rendered is not None:
        return rendered
    marker = getattr(processor, "image_token", None) or "<image>"
    return marker * num_images + text


def render_messages(processor: Any, messages: list[dict[str, Any]]) -> str | None:
    """Content-part messages through the model's chat template (the processor's, else the tokenizer's);
    None where it has none."""
    tokenizer = getattr(processor, "tokenizer", processor)
    for owner in (processor, tokenizer):
        if getattr(owner, "chat_template", None):
            return owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return None


def probe_features(model: Any, path: str) -> tuple[list[int], Any, dict[str, Any]]:
    """A one-image prompt's ids and images, and the fields `get_input_embeddings` returns for it."""
    from engine.prompt.image_processor import ImagePreprocessor

    preprocessor = model.preprocessor = ImagePreprocessor.load(path)
    text = render_user_turn(preprocessor.processor, PROBE_TEXT, 1)
    ids, images = preprocessor.process(text, [probe_picture()], max_pixels=10**8)
    return ids, images, model.features(ids, images.pixel_values, images.extras)
