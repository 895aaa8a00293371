"""The vision encoder's output per set of images, kept by the images' content hash so that a conversation
that resends its images (every chat UI and agent does) does not encode them again.

Owns the cached image rows (the merged embeddings at the image tokens, and DeepStack features), bounded
by bytes, least recently used first out. Applies only where the load-time probe proved that a prompt's
embeddings are its token embeddings with the image rows scattered in (`scatter_proof`); never holds text.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np


@dataclass
class ImageRows:
    rows: mx.array  # (num_image_tokens, hidden): the embeddings at the image tokens, in prompt order
    deepstack: list[mx.array] | None  # per layer (num_image_tokens, hidden), or None
    visual_mask: bool = False  # the model takes `visual_pos_masks` (DeepStack, vision-only adapters)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + sum(a.nbytes for a in self.deepstack or [])


class EncoderCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.num_queries = 0
        self.num_hits = 0
        self._entries: OrderedDict[str, ImageRows] = OrderedDict()

    def get(self, key: str) -> ImageRows | None:
        self.num_queries += 1
        entry = self._entries.get(key)
        if entry is None:
            return None
        self.num_hits += 1
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: ImageRows) -> None:
        if entry.nbytes > self.max_bytes or key in self._entries:
            return
        self._entries[key] = entry
        self.num_bytes += entry.nbytes
        while self.num_bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.num_bytes -= old.nbytes


def image_rows(features: dict[str, Any], image_mask: np.ndarray) -> ImageRows:
    """The cacheable part of a prompt's features: the rows at its image tokens."""
    index = mx.array(np.flatnonzero(image_mask).astype(np.uint32))
    deepstack = features.get("deepstack_visual_embeds")
    deep = list(deepstack) if deepstack is not None else None
    return ImageRows(features["inputs_embeds"][0][index], deep, "visual_pos_masks" in features)


def rebuild(embed_tokens: Any, prompt_token_ids: list[int], image_mask: np.ndarray, entry: ImageRows) -> dict:
    """A prompt's features from its token embeddings and cached image rows."""
    embeds = embed_tokens(mx.array([prompt_token_ids], dtype=mx.int32))
    index = mx.array(np.flatnonzero(image_mask).astype(np.uint32))
    embeds[0, index] = entry.rows.astype(embeds.dtype)
    features: dict[str, Any] = {"inputs_embeds": embeds}
    if entry.visual_mask:
        features["visual_pos_masks"] = mx.array(image_mask[None])
    if entry.deepstack is not None:
        features["deepstack_visual_embeds"] = entry.deepstack
    return features


def scatter_proof(
    embed_tokens: Any,
    prompt_token_ids: list[int],
    image_mask: np.ndarray,
    features: dict,
    ignored: tuple = (),
) -> str | None:
    """None where `features` equal their rebuild from token embeddings and image rows (so cached rows
    give the same prompt), else why not. `ignored`: fields the engine never hands the model."""
    known = {"inputs_embeds", "visual_pos_masks", "deepstack_visual_embeds", "position_ids", "rope_deltas"}
    if set(features) - known - set(ignored):
        return "the model returns inputs beside its embeddings"
    masks = features.get("visual_pos_masks")
    if masks is not None and not np.array_equal(np.array(masks[0]).astype(bool), image_mask):
        return "its DeepStack features sit at other positions than its image tokens"
    rebuilt = rebuild(embed_tokens, prompt_token_ids, image_mask, image_rows(features, image_mask))
    if set(rebuilt) != set(features) - {"position_ids", "rope_deltas"} - set(ignored):
        return "its features are not image rows, a visual mask and DeepStack features alone"
    same = mx.array_equal(
        rebuilt["inputs_embeds"].astype(features["inputs_embeds"].dtype), features["inputs_embeds"]
    )
    return None if bool(same) else "its text rows are not its token embeddings"
