"""Serves an mlx-vlm vision-language model on the paged engine: loads it, hands the runner its language
model in mlx-lm's calling convention (with cache kinds the engine maps), and decides at load, from what
the model itself returns for a probe image, whether and how the paged engine serves it.

Owns the vision inputs the engine knows (CARRIED, DROPPED, REFUSED, WHOLE_PROMPT_ONLY) and the load-time
refusal that names a missing capability. Never touches the KV cache, the block pool or the scheduler; what one forward gets from a request's
images is engine/models/vision_inputs.py.
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.models.encoder_cache import EncoderCache, scatter_proof
from engine.models.vision_config import image_token_id

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as lm_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer_at

logger = logging.getLogger(__name__)

# What `get_input_embeddings` may return besides `inputs_embeds`, and how the engine treats each: the
# fields it carries into prefill chunks, the ones it drops as mlx-vlm's own generation does, and the
# ones it cannot serve (the reason names the capability).
CARRIED = ("position_ids", "rope_deltas", "visual_pos_masks", "deepstack_visual_embeds")
DROPPED = ("attention_mask_4d",)  # mlx-vlm's generate hands it to language models that ignore it
# Never served: inputs every decode step needs, or a decoder fed by an encoder.
REFUSED = {
    "cross_attention_states": "cross-attention to the image states at every decode step (mllama style)",
    "cross_attention_mask": "cross-attention to the image states at every decode step (mllama style)",
    "full_text_row_masked_out_mask": "cross-attention to the image states at every decode step",
    "decoder_inputs_embeds": "an encoder-decoder language model (decoder_inputs_embeds)",
}
# Served only where the prompt is computed whole (one chunk gets them as mlx-vlm's prefill does).
WHOLE_PROMPT_ONLY = {
    "per_layer_inputs": "per-layer token inputs next to the embeddings (per_layer_inputs)",
    "attention_mask": "its own attention mask over the prompt (attention_mask)",
    "pos_hw": "2-D image positions handed to every layer (pos_hw)",
}


class UnsupportedVisionModelError(ValueError):
    pass


class VisionLanguageModel:
    """The language model of an mlx-vlm model, called like an mlx-lm model (`model(ids, cache=...)`,
    `input_embeddings=` for a prefill that carries images, `position_ids=` (axes, B, L) for M-RoPE,
    `visual_pos_masks=` / `deepstack_visual_embeds=` for DeepStack), plus the vision path."""

    def __init__(
        self, vlm: Any, image_token_id: int | None, dtype: mx.Dtype, position_axes: int | None = None
    ):
        self.vlm = vlm
        self.language_model = vlm.language_model
        self.image_token_id = image_token_id
        self.dtype = dtype
        # M-RoPE: every row gets explicit positions with this many axes (time, height, width); None: the
        # language model places tokens at its cache offset.
        self.position_axes = position_axes
        # Set at load where the probe proved that cached image rows rebuild a prompt's features.
        self.encoder_cache: EncoderCache | None = None
        self.summary = ""  # for /v1/status: the model's vision inputs and its encoder cache
        # The prompt attends bidirectionally (prefix-LM): one chunk, given every input mlx-vlm gives it.
        self.whole_prompt = False
        self.preprocessor: Any = None  # the load probe's ImagePreprocessor, for callers in this process
        embedding = token_embedding(self.language_model)
        weight = getattr(embedding, "weight", None)
        self.args = SimpleNamespace(vocab_size=weight.shape[0] if weight is not None else None)

    @property
    def mrope(self) -> bool:
        return self.position_axes is not None

    @property
    def layers(self) -> list[Any]:
        return self.language_model.layers

    def make_cache(self) -> list[Any]:
        """The language model's cache kinds as mlx-lm's classes, which the paged engine maps."""
        own = getattr(self.language_model, "make_cache", None)
        return [as_mlx_lm_cache(c) for c in own()] if own else [lm_cache.KVCache() for _ in self.layers]

    def __call__(
        self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None, **extras
    ):
        if self.position_axes is not None and "position_ids" not in extras:  # text rows: 1-D positions
            offset = next((c.offset for c in _leaves(cache or []) if hasattr(c, "offset")), 0)
            start = offset[:, None] if isinstance(offset, mx.array) else mx.array([[offset]])
            rows = start + mx.arange(inputs.shape[1])[None]
            extras["position_ids"] = mx.broadcast_to(rows, (self.position_axes, *rows.shape))
        # Explicit positions bypass mlx-vlm's own per-model position state (one request at a time).
        return self.language_model(inputs, inputs_embeds=input_embeddings, cache=cache, **extras).logits

    @property
    def embed_tokens(self) -> Any:
        return token_embedding(self.language_model)

    def features(
        self, prompt_token_ids: list[int], pixel_values: Any, extras: dict[str, Any]
    ) -> dict[str, Any]:
        """The model's own `get_input_embeddings` for a whole prompt, as a dict of its non-empty fields."""
        ids = mx.array([prompt_token_ids], dtype=mx.int32)
        pixels = to_mlx(pixel_values)
        pixels = pixels.astype(self.dtype) if isinstance(pixels, mx.array) else pixels
        kwargs = {name: to_mlx(value) for name, value in extras.items()}
        mask = kwargs.pop("attention_mask", None)
        out = self.vlm.get_input_embeddings(ids, pixels, mask=mask, **kwargs).to_dict()
        out["inputs_embeds"] = out["inputs_embeds"].astype(self.dtype)
        return {name: value for name, value in out.items() if value is not None}

    def rope_index(self, prompt_token_ids: list[int], extras: dict[str, Any]) -> dict[str, Any]:
        """M-RoPE positions of a prompt from its ids and image grids alone (no vision tower)."""
        ids = mx.array([prompt_token_ids], dtype=mx.int32)
        grid, mask = to_mlx(extras.get("image_grid_thw")), to_mlx(extras.get("attention_mask"))
        positions, deltas = self.language_model.get_rope_index(ids, image_grid_thw=grid, attention_mask=mask)
        return {"position_ids": positions, "rope_deltas": deltas}


def token_embedding(language_model: Any) -> Any:
    """The language model's token embedding layer, wherever the architecture keeps it; None if none."""
    from mlx import nn

    for owner in (
        language_model,
        getattr(language_model, "model", None),
        getattr(language_model, "backbone", None),
    ):
        for name in ("embed_tokens", "embeddings", "wte", "tok_embeddings"):
            layer = getattr(owner, name, None)
            if isinstance(layer, nn.Module) and (hasattr(layer, "weight") or hasattr(layer, "embedding")):
                return layer
    return None


def _leaves(caches: list[Any]) -> list[Any]:
    out: list[Any] = []
    for cache in caches:
        out += _leaves(list(cache.caches)) if hasattr(cache, "caches") else [cache]
    return out


def to_mlx(value: Any) -> Any:
    if isinstance(value, list):
        return [to_mlx(v) for v in value]
    return mx.array(value) if hasattr(value, "__array__") else value


def as_mlx_lm_cache(cache: Any) -> Any:
    """An mlx-vlm cache object as the mlx-lm class of the same kind; others stay the model's own."""
    name = type(cache).__name__
    if name == "KVCache":
        return lm_cache.KVCache()
    if name == "RotatingKVCache":
        return lm_cache.RotatingKVCache(max_size=cache.max_size, keep=getattr(cache, "keep", 0))
    if name == "ChunkedKVCache":
        return lm_cache.ChunkedKVCache(cache.chunk_size)
    if name == "ArraysCache":  # mlx-vlm's own: its models call its update_window / update_recurrent
        return type(cache)(len(cache.cache))
    if name == "CacheList":  # mlx-vlm's own, which its layers check for
        return type(cache)(*(as_mlx_lm_cache(c) for c in cache.caches))
    return cache


def refusal(fields: set[str], language_model: Any, whole_prompt: bool) -> str | None:
    """Why the engine cannot serve a model whose `get_input_embeddings` returned `fields`, or None."""
    for name in sorted(fields):
        if name in REFUSED:
            return REFUSED[name]
        if name in WHOLE_PROMPT_ONLY and not whole_prompt:
            return WHOLE_PROMPT_ONLY[name] + " with a prompt computed in chunks"
        if name not in (*CARRIED, *DROPPED, *WHOLE_PROMPT_ONLY, "inputs_embeds"):
            return f"an input the engine does not know ({name})"
    call = inspect.getsource(type(language_model).__call__)
    if "attention_mask_4d" in fields and "attention_mask_4d" in call and not whole_prompt:
        return "a bidirectional image attention mask over the whole prompt (attention_mask_4d)"
    return None


def needs_whole_prompt(vlm: Any, ids: list[int], extras: dict[str, Any], fields: dict[str, Any]) -> bool:
    """The model's own word (mlx-vlm's chunked-prefill policy) on whether its prompt must be computed in
    one pass: it attends bidirectionally over the prompt or its images (PaliGemma's prefix-LM)."""
    from mlx_vlm.generate.common import _chunked_prefill_enabled

    kwargs = {
        **{k: to_mlx(v) for k, v in extras.items()},
        **{k: v for k, v in fields.items() if k != "inputs_embeds"},
    }
    enabled = _chunked_prefill_enabled(
        vlm, input_ids=mx.array([ids]), inputs_embeds=fields["inputs_embeds"], prefill_kwargs=kwargs
    )
    return not enabled


def load_vision_model(
    path: str, config: dict[str, Any], dtype: mx.Dtype, set_dtype: bool, encoder_cache_bytes: int = 256 << 20
) -> tuple[VisionLanguageModel, TokenizerWrapper]:
    """Loads a local mlx-vlm model directory and its tokenizer; `set_dtype` casts the weights to `dtype`.
    A probe image through the model's processor and `get_input_embeddings` decides whether it is served."""
    from engine.models.vision_probe import probe_features

    model_type = config.get("model_type")
    vlm = _load_vlm(path, model_type)
    if set_dtype:
        vlm.set_dtype(dtype)
    mx.eval(vlm.parameters())
    try:
        tokenizer = load_tokenizer_at(Path(path), eos_token_ids=eos_token_ids(Path(path), config))
    except Exception as exc:
        raise UnsupportedVisionModelError(
            f"the {model_type} tokenizer does not load through transformers: {exc}"
        ) from exc
    model = VisionLanguageModel(vlm, image_token_id(config), dtype)
    ids, images, fields = probe_features(model, path)
    _decide_serving(model, model_type, ids, images.extras, fields)
    why = "engine.encoder_cache_bytes is 0"
    if encoder_cache_bytes and (why := encoder_cache_refusal(model, ids, images.extras, fields)) is None:  # type: ignore[assignment]
        model.encoder_cache = EncoderCache(encoder_cache_bytes)
    cache = f"on ({encoder_cache_bytes >> 20} MiB)" if model.encoder_cache else f"off: {why}"
    model.summary = f"inputs: {', '.join(sorted(fields))}; encoder cache {cache}"
    if model.whole_prompt:
        model.summary += "; prompt computed whole (bidirectional prompt attention)"
    logger.info("loaded vision-language model %s (%s): %s", path, model_type, model.summary)
    return model, tokenizer


def _compact_deepstack(fields: dict[str, Any]) -> bool:
    """DeepStack features, if any, hold one row per visual position (Qwen3-VL's layout), which the engine
    slices per chunk and row."""
    deep, masks = fields.get("deepstack_visual_embeds"), fields.get("visual_pos_masks")
    if deep is None:
        return True
    if not isinstance(deep, list | tuple) or masks is None:
        return False
    return all(layer.shape[0] == int(np.array(masks).sum()) for layer in deep)


def _load_vlm(path: str, model_type: str | None) -> Any:
    from mlx_vlm.utils import load_model as load_vlm

    try:
        vlm = load_vlm(Path(path))
    except Exception as exc:
        raise UnsupportedVisionModelError(f"mlx-vlm cannot load this {model_type} model: {exc}") from exc
    if not hasattr(vlm, "get_input_embeddings") or not hasattr(vlm, "language_model"):
        raise UnsupportedVisionModelError(f"{model_type} is not a text generator: it has no language model")
    return vlm


def _decide_serving(
    model: VisionLanguageModel, model_type: str | None, ids: list[int], extras: dict, fields: dict
) -> None:
    """Sets how the engine feeds the model (whole prompt, M-RoPE axes) from the probe, or refuses it."""
    model.whole_prompt = needs_whole_prompt(model.vlm, ids, extras, fields)
    reason = refusal(set(fields), model.language_model, model.whole_prompt)
    if not reason and fields["inputs_embeds"].shape[1] != len(ids):
        reason = "image features that change the prompt's length (it widens its image tokens itself)"
    if not reason and not _compact_deepstack(fields):
        reason = "DeepStack features laid out over the whole prompt, which its layers slice by their own cache offset"
    if not reason and model.embed_tokens is None:
        reason = "a token embedding layer the engine can find (embed_tokens)"
    if reason:
        raise UnsupportedVisionModelError(
            f"vision model type {model_type!r} needs {reason}, which the paged engine does not serve"
        )
    positions = fields.get("position_ids")
    if positions is None and hasattr(model.language_model, "get_rope_index"):
        try:  # the model keeps its M-RoPE positions to itself (GLM-4V): ask for them, and hand them back
            rope = model.rope_index(ids, extras)
            model.language_model(
                mx.array([ids]), inputs_embeds=fields["inputs_embeds"], position_ids=rope["position_ids"]
            )
            fields.update(rope)
            positions = fields["position_ids"]
        except (TypeError, ValueError, AttributeError) as exc:
            raise UnsupportedVisionModelError(
                f"vision model type {model_type!r} keeps M-RoPE positions inside its language model and does "
                f"not take them back as position_ids ({exc}), which the paged engine does not serve"
            ) from exc
    model.position_axes = positions.shape[0] if positions is not None and positions.ndim == 3 else None


def encoder_cache_refusal(
    model: VisionLanguageModel, ids: list[int], extras: dict, fields: dict
) -> str | None:
    """None where cached image rows (and, for M-RoPE, positions from the ids and grids) rebuild the
    probe prompt's features exactly; else why the encoder cache steps aside."""
    if model.image_token_id is None:
        return "the model names no image token: its image features sit where it places them"
    mask = np.asarray(ids) == model.image_token_id
    ignored = () if model.whole_prompt else DROPPED
    if (why := scatter_proof(model.embed_tokens, ids, mask, fields, ignored)) is not None:
        return why
    if not model.mrope:
        return None
    try:
        rebuilt = model.rope_index(ids, extras)
    except (TypeError, ValueError, AttributeError) as exc:
        return f"its positions come from more than ids and grids ({exc})"
    same = mx.array_equal(rebuilt["position_ids"], fields["position_ids"])
    return None if bool(same) else "its positions come from more than ids and grids"


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
