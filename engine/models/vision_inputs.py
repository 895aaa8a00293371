"""What one forward of a vision-language model gets from its rows' images: the merged input embeddings
while a request's prefill runs (computed once per request, or rebuilt from the encoder cache, sliced per
chunk, dropped when the prefill is done), M-RoPE positions for every row, and DeepStack features for the
image tokens a chunk holds.

Owns the slicing of a prompt's vision inputs into chunks and rows; never touches the KV cache, the block
pool or the scheduler. Decode is text-only and runs on token ids like any model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.core.vision_state import VisionState
from engine.models.encoder_cache import image_rows, rebuild
from engine.models.vision_model import VisionLanguageModel, to_mlx

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    from engine.core.scheduler import ScheduledRequest


def model_inputs(model: Any, chunk: list[ScheduledRequest], tokens: mx.array) -> dict[str, Any]:
    """Extra model-call arguments for one forward: `input_embeddings` (B, L, hidden) when a row is in
    the prefill of a request with images, `position_ids` (axes, B, L) for an M-RoPE model, DeepStack
    `visual_pos_masks` / `deepstack_visual_embeds` when a row's chunk holds image tokens."""
    if not isinstance(model, VisionLanguageModel):
        return {}
    prefill = {
        b: s for b, s in enumerate(chunk) if s.request.vision and s.request.vision.needs_embeddings(s.start)
    }
    for item in prefill.values():
        ensure_features(model, item.request.prompt_token_ids, item.request.vision)  # type: ignore[arg-type]
    inputs: dict[str, Any] = {}
    if model.mrope:
        inputs["position_ids"] = _position_ids(model, chunk, tokens.shape[1])
    if prefill and model.whole_prompt:  # one row, the whole prompt: every input mlx-vlm's prefill gets
        inputs = {**_whole_prompt_inputs(next(iter(prefill.values()))), **inputs}
    if prefill:
        inputs.update(_deepstack(chunk, prefill, tokens.shape[1]))
        inputs["input_embeddings"] = _input_embeddings(model, chunk, prefill, tokens)
    return inputs


def ensure_features(model: VisionLanguageModel, prompt_token_ids: list[int], state: VisionState) -> None:
    """The request's prompt features and M-RoPE positions, from the encoder cache where it applies."""
    if state.features is not None:
        return
    mask = np.asarray(prompt_token_ids) == model.image_token_id
    cached = model.encoder_cache.get(state.inputs.image_hash) if model.encoder_cache else None
    if cached is not None and cached.rows.shape[0] == int(mask.sum()):
        state.features = rebuild(model.embed_tokens, prompt_token_ids, mask, cached)
        if model.mrope:
            state.features.update(model.rope_index(prompt_token_ids, state.inputs.extras))
    else:
        state.features = model.features(prompt_token_ids, state.inputs.pixel_values, state.inputs.extras)
        if model.mrope and "position_ids" not in state.features:
            state.features.update(model.rope_index(prompt_token_ids, state.inputs.extras))
        if model.encoder_cache is not None:
            model.encoder_cache.put(state.inputs.image_hash, image_rows(state.features, mask))
    mx.async_eval(state.features["inputs_embeds"])
    if model.mrope and state.mrope_positions is None:
        positions = np.array(state.features["position_ids"][:, 0, :])
        deltas = state.features.get("rope_deltas")
        delta = (
            int(np.array(deltas).reshape(-1)[0])
            if deltas is not None
            else int(positions.max()) + 1 - len(prompt_token_ids)
        )
        state.mrope_positions, state.rope_delta = positions, delta


def _whole_prompt_inputs(item: ScheduledRequest) -> dict[str, Any]:
    state: VisionState = item.request.vision  # type: ignore[assignment]
    assert state.features is not None and item.start == 0, "a whole-prompt request's prompt is one chunk"
    extras = {k: to_mlx(v) for k, v in state.inputs.extras.items() if k != "attention_mask"}
    return {**extras, **{k: v for k, v in state.features.items() if k != "inputs_embeds"}}


def _position_ids(model: VisionLanguageModel, chunk: list[ScheduledRequest], num_new: int) -> mx.array:
    axes = model.position_axes or 1
    rows = []
    for item in chunk:
        state = item.request.vision
        if state is None or state.mrope_positions is None:
            rows.append(np.broadcast_to(np.arange(item.start, item.start + num_new), (axes, num_new)))
        else:
            rows.append(state.position_ids(item.start, num_new))
    return mx.array(np.stack(rows, axis=1).astype(np.int32))


def _input_embeddings(
    model: VisionLanguageModel,
    chunk: list[ScheduledRequest],
    prefill: dict[int, ScheduledRequest],
    tokens: mx.array,
) -> mx.array:
    if len(chunk) == 1:
        return _row_embeddings(model, chunk[0], tokens[0])[None]
    embeds = model.embed_tokens(tokens)
    for b, item in prefill.items():
        embeds[b] = _row_embeddings(model, item, tokens[b])
    return embeds


def _row_embeddings(model: VisionLanguageModel, item: ScheduledRequest, row_tokens: mx.array) -> mx.array:
    """(L, hidden) for one row: the prompt's merged embeddings, then (after a preemption's recompute
    reaches the output) plain token embeddings. The prefill's last chunk drops the features."""
    state: VisionState = item.request.vision  # type: ignore[assignment]
    assert state.features is not None, "model_inputs computed them for this forward"
    embeddings = state.features["inputs_embeds"]
    num_new = row_tokens.shape[0]
    end = min(item.start + num_new, state.num_prompt_tokens)
    if end == state.num_prompt_tokens:
        state.features = None  # a recompute after preemption rebuilds them
    prompt_part = embeddings[0, item.start : end]
    if end - item.start == num_new:
        return prompt_part
    return mx.concatenate([prompt_part, model.embed_tokens(row_tokens[end - item.start :])])


def _deepstack(
    chunk: list[ScheduledRequest], prefill: dict[int, ScheduledRequest], num_new: int
) -> dict[str, Any]:
    """The (B, L) visual-position mask of the chunk's rows (DeepStack, vision-only adapters) and, per
    layer, the DeepStack features of the chunk's image tokens, batch-major."""
    masks = np.zeros((len(chunk), num_new), dtype=bool)
    parts: list[list[mx.array]] = []
    for b, item in prefill.items():
        features = item.request.vision.features  # type: ignore[union-attr]
        assert features is not None, "model_inputs computed them for this forward"
        if "visual_pos_masks" not in features:
            continue
        prompt_mask = np.array(features["visual_pos_masks"][0]).astype(bool)
        row = prompt_mask[item.start : item.start + num_new]
        masks[b, : len(row)] = row
        if "deepstack_visual_embeds" in features:
            first = int(prompt_mask[: item.start].sum())
            parts.append(
                [layer[first : first + int(row.sum())] for layer in features["deepstack_visual_embeds"]]
            )
    if not any("visual_pos_masks" in (s.request.vision.features or {}) for s in prefill.values()):  # type: ignore[union-attr]
        return {}
    inputs: dict[str, Any] = {"visual_pos_masks": mx.array(masks)}
    if parts:
        inputs["deepstack_visual_embeds"] = [
            mx.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))
        ]
    return inputs
