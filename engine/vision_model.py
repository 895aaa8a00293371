"""Serves an mlx-vlm vision-language model on the paged engine: loads it, hands the runner its language
model in mlx-lm's calling convention, and merges image features into a prompt's input embeddings.

Owns which mlx-vlm architectures are served, and the embeddings a VLM request's prefill runs on
(computed once per request, sliced per chunk, dropped when the prefill is done). Never touches the KV
cache, the block pool or the scheduler; decode is text-only and runs on token ids like any model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from engine.messages import ImageInputs
from engine.vision_state import VisionState

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer_at

if TYPE_CHECKING:
    from engine.scheduler import ScheduledRequest

logger = logging.getLogger(__name__)

# Served: architectures whose language model takes `inputs_embeds`, places every token (image tokens
# included) at 1-D RoPE position `cache.offset`, and attends causally, as the paged cache does.
# Refused: M-RoPE models (qwen2_vl, qwen2_5_vl, qwen3_vl, glm4v, ...) put image tokens on a (t, h, w)
# grid and shift every later position by a per-request delta, which one integer offset cannot carry.
SUPPORTED_MODEL_TYPES = ("idefics3", "smolvlm")


class UnsupportedVisionModelError(ValueError):
    pass


def is_vision_config(config: dict[str, Any]) -> bool:
    """mlx-vlm checkpoints carry a vision tower config; mlx-lm ones never do."""
    return isinstance(config.get("vision_config"), dict)


def image_token_id(config: dict[str, Any]) -> int:
    for key in ("image_token_id", "image_token_index"):
        if isinstance(config.get(key), int):
            return config[key]
    raise UnsupportedVisionModelError("the VLM config names no image_token_id")


class VisionLanguageModel:
    """The language model of an mlx-vlm model, called like an mlx-lm model (`model(ids, cache=...)`,
    `input_embeddings=` for a prefill that carries images), plus the vision path."""

    def __init__(self, vlm: Any, image_token_id: int, dtype: mx.Dtype):
        self.vlm = vlm
        self.language_model = vlm.language_model
        self.image_token_id = image_token_id
        self.dtype = dtype
        self.args = SimpleNamespace(vocab_size=self.language_model.embed_tokens.weight.shape[0])

    @property
    def layers(self) -> list[Any]:
        return self.language_model.layers

    def __call__(self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None):
        return self.language_model(inputs, inputs_embeds=input_embeddings, cache=cache).logits

    def embed_tokens(self, token_ids: mx.array) -> mx.array:
        return self.language_model.embed_tokens(token_ids)

    def prompt_embeddings(self, prompt_token_ids: list[int], images: ImageInputs) -> mx.array:
        """(1, prompt_len, hidden): the vision tower's features scattered into the image tokens' slots."""
        ids = mx.array([prompt_token_ids], dtype=mx.int32)
        pixels = mx.array(images.pixel_values).astype(self.dtype)
        extras = {name: mx.array(value) for name, value in images.extras.items()}
        return self.vlm.get_input_embeddings(ids, pixels, **extras).inputs_embeds.astype(self.dtype)


def input_embeddings(model: Any, chunk: list[ScheduledRequest], tokens: mx.array) -> dict[str, mx.array]:
    """Extra model-call arguments for one forward: `input_embeddings` (B, L, hidden) when a row is in
    the prefill of a request with images, else nothing (the model embeds the token ids itself)."""
    if not isinstance(model, VisionLanguageModel):
        return {}
    rows = {
        b: s for b, s in enumerate(chunk) if s.request.vision and s.request.vision.needs_embeddings(s.start)
    }
    if not rows:
        return {}
    if len(chunk) == 1:
        return {"input_embeddings": _row_embeddings(model, chunk[0], tokens[0])[None]}
    embeds = model.embed_tokens(tokens)
    for b, item in rows.items():
        embeds[b] = _row_embeddings(model, item, tokens[b])
    return {"input_embeddings": embeds}


def _row_embeddings(model: VisionLanguageModel, item: ScheduledRequest, row_tokens: mx.array) -> mx.array:
    """(L, hidden) for one row: the prompt's merged embeddings, then (after a preemption's recompute
    reaches the output) plain token embeddings."""
    state: VisionState = item.request.vision  # type: ignore[assignment]
    if state.embeddings is None:
        state.embeddings = model.prompt_embeddings(item.request.prompt_token_ids, state.inputs)
        mx.async_eval(state.embeddings)
    embeddings = state.embeddings
    num_new = row_tokens.shape[0]
    end = min(item.start + num_new, state.num_prompt_tokens)
    if end == state.num_prompt_tokens:
        state.embeddings = None  # the prefill is done; a recompute after preemption rebuilds them
    prompt_part = embeddings[0, item.start : end]
    if end - item.start == num_new:
        return prompt_part
    return mx.concatenate([prompt_part, model.embed_tokens(row_tokens[end - item.start :])])


def load_vision_model(
    path: str, config: dict[str, Any], dtype: mx.Dtype, set_dtype: bool
) -> tuple[VisionLanguageModel, TokenizerWrapper]:
    """Loads a local mlx-vlm model directory and its tokenizer; `set_dtype` casts the weights to `dtype`."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedVisionModelError(
            f"vision model type {model_type!r} is not served: its positions do not fit the paged cache's "
            f"1-D offsets; serve one of {', '.join(SUPPORTED_MODEL_TYPES)} (e.g. a SmolVLM checkpoint)"
        )
    from mlx_vlm.utils import load_model as load_vlm

    vlm = load_vlm(Path(path))
    if set_dtype:
        vlm.set_dtype(dtype)
    mx.eval(vlm.parameters())
    tokenizer = load_tokenizer_at(Path(path), eos_token_ids=eos_token_ids(Path(path), config))
    logger.info("loaded vision-language model %s (%s)", path, model_type)
    return VisionLanguageModel(vlm, image_token_id(config), dtype), tokenizer


def eos_token_ids(path: Path, config: dict[str, Any]) -> list[int] | None:
    """The checkpoint's end tokens: generation_config.json first (SmolVLM ends turns there), then config."""
    sources = [config, config.get("text_config", {})]
    generation = path / "generation_config.json"
    if generation.exists():
        sources.insert(0, json.loads(generation.read_text()))
    for source in sources:
        value = source.get("eos_token_id")
        if value is not None:
            return [value] if isinstance(value, int) else list(value)
    return None
