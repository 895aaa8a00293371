"""Serves an mlx-vlm vision-language model on the paged engine: loads it, hands the runner its language
model in mlx-lm's calling convention, and merges image features into a prompt's input embeddings.

Owns which mlx-vlm architectures are served, the embeddings a VLM request's prefill runs on
(computed once per request, sliced per chunk, dropped when the prefill is done) and, for M-RoPE models,
the 3-D positions of every row of a forward. Never touches the KV cache, the block pool or the
scheduler; decode is text-only and runs on token ids like any model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from engine.core.vision_state import VisionState
from engine.messages import ImageInputs

import mlx.core as mx
import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer_at

if TYPE_CHECKING:
    from engine.core.scheduler import ScheduledRequest

logger = logging.getLogger(__name__)

# Served: architectures whose language model takes `inputs_embeds` and attends causally, as the paged
# cache does, and places tokens either at 1-D RoPE position `cache.offset` or (M-RoPE) at explicit
# (time, height, width) `position_ids` that the runner passes for every row.
# Refused: others, e.g. qwen3_vl (deepstack: image features enter several layers, not the embeddings).
ROPE_1D_MODEL_TYPES = ("idefics3", "smolvlm")
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
SUPPORTED_MODEL_TYPES = ROPE_1D_MODEL_TYPES + MROPE_MODEL_TYPES


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
    `input_embeddings=` for a prefill that carries images, `position_ids=` (3, B, L) for M-RoPE), plus
    the vision path."""

    def __init__(self, vlm: Any, image_token_id: int, dtype: mx.Dtype, mrope: bool = False):
        self.vlm = vlm
        self.language_model = vlm.language_model
        self.image_token_id = image_token_id
        self.dtype = dtype
        self.mrope = mrope
        self.args = SimpleNamespace(vocab_size=self.embed_tokens.weight.shape[0])

    @property
    def layers(self) -> list[Any]:
        return self.language_model.layers

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        input_embeddings: mx.array | None = None,
        position_ids: mx.array | None = None,
    ):
        if not self.mrope:
            return self.language_model(inputs, inputs_embeds=input_embeddings, cache=cache).logits
        if position_ids is None:  # text rows only: every axis at the 1-D position
            offset = cache[0].offset if cache else 0
            start = offset[:, None] if isinstance(offset, mx.array) else mx.array([[offset]])
            rows = start + mx.arange(inputs.shape[1])[None]
            position_ids = mx.broadcast_to(rows, (3, inputs.shape[0], inputs.shape[1]))
        # Explicit positions bypass mlx-vlm's own per-model position state (one request at a time).
        return self.language_model(
            inputs, inputs_embeds=input_embeddings, cache=cache, position_ids=position_ids
        ).logits

    @property
    def embed_tokens(self) -> Any:
        model = self.language_model
        return model.embed_tokens if hasattr(model, "embed_tokens") else model.model.embed_tokens

    def prompt_embeddings(self, prompt_token_ids: list[int], images: ImageInputs) -> mx.array:
        """(1, prompt_len, hidden): the vision tower's features scattered into the image tokens' slots."""
        ids = mx.array([prompt_token_ids], dtype=mx.int32)
        pixels = mx.array(images.pixel_values).astype(self.dtype)
        extras = {name: mx.array(value) for name, value in images.extras.items()}
        return self.vlm.get_input_embeddings(ids, pixels, **extras).inputs_embeds.astype(self.dtype)

    def set_mrope_positions(self, prompt_token_ids: list[int], state: VisionState) -> None:
        """The prompt's (3, len) M-RoPE positions and later tokens' shift, from the images' grids."""
        grid = mx.array(state.inputs.extras["image_grid_thw"])
        positions, delta = self.language_model.get_rope_index(mx.array([prompt_token_ids]), grid)
        state.mrope_positions = np.array(positions[:, 0, :])
        state.rope_delta = int(delta.reshape(-1)[0].item())


def model_inputs(model: Any, chunk: list[ScheduledRequest], tokens: mx.array) -> dict[str, mx.array]:
    """Extra model-call arguments for one forward: `input_embeddings` (B, L, hidden) when a row is in
    the prefill of a request with images, `position_ids` (3, B, L) when an M-RoPE model serves a request
    with images; else nothing (the model embeds the token ids and places them itself)."""
    if not isinstance(model, VisionLanguageModel):
        return {}
    inputs = _input_embeddings(model, chunk, tokens)
    if model.mrope and any(s.request.vision for s in chunk):
        inputs["position_ids"] = _position_ids(model, chunk, tokens.shape[1])
    return inputs


def _position_ids(model: VisionLanguageModel, chunk: list[ScheduledRequest], num_new: int) -> mx.array:
    rows = []
    for item in chunk:
        state = item.request.vision
        if state is None:
            rows.append(np.broadcast_to(np.arange(item.start, item.start + num_new), (3, num_new)))
            continue
        if state.mrope_positions is None:
            model.set_mrope_positions(item.request.prompt_token_ids, state)
        rows.append(state.position_ids(item.start, num_new))
    return mx.array(np.stack(rows, axis=1).astype(np.int32))


def _input_embeddings(model: VisionLanguageModel, chunk: list[ScheduledRequest], tokens: mx.array) -> dict:
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
            f"vision model type {model_type!r} is not served by the paged engine; serve one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (e.g. a SmolVLM or Qwen2-VL checkpoint)"
        )
    from mlx_vlm.utils import load_model as load_vlm

    vlm = load_vlm(Path(path))
    if set_dtype:
        vlm.set_dtype(dtype)
    mx.eval(vlm.parameters())
    tokenizer = load_tokenizer_at(Path(path), eos_token_ids=eos_token_ids(Path(path), config))
    logger.info("loaded vision-language model %s (%s)", path, model_type)
    return VisionLanguageModel(
        vlm, image_token_id(config), dtype, mrope=model_type in MROPE_MODEL_TYPES
    ), tokenizer


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
