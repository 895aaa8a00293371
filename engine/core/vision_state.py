"""One request's images inside the engine: the processed inputs, where its image tokens sit, and the
merged input embeddings while its prefill runs.

Owns the rule that keeps prefix caching honest: a KV block holding image tokens is keyed by the images'
content hash as well as its token ids (`block_key`); and, for M-RoPE models, each token's 3-D
position. Holds no MLX at import; the features and positions are filled by engine/models/vision_inputs.py.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidRequestError
from engine.messages import ImageInputs

import numpy as np


@dataclass(eq=False)
class VisionState:
    inputs: ImageInputs
    image_positions: list[int]  # sorted prompt positions of image placeholder tokens
    num_prompt_tokens: int
    # The model's prompt features (engine/models/vision_inputs.py: merged embeddings (1, len, hidden),
    # DeepStack features, M-RoPE positions) while the prefill needs them.
    features: dict[str, Any] | None = None
    # M-RoPE models (Qwen2-VL): the prompt's (time, height, width) positions, (3, num_prompt_tokens),
    # and the shift of every later position, set once by engine/models/vision_inputs.py. None elsewhere.
    mrope_positions: np.ndarray | None = None
    rope_delta: int = 0
    _key: bytes = field(init=False)

    def __post_init__(self) -> None:
        self._key = b"images:" + self.inputs.image_hash.encode()

    def block_key(self, start: int, end: int) -> bytes | None:
        """The images' key if any image token lies in prompt positions [start, end), else None."""
        i = bisect_left(self.image_positions, start)
        return self._key if i < len(self.image_positions) and self.image_positions[i] < end else None

    def needs_embeddings(self, start: int) -> bool:
        """A chunk from `start` still lies in the prompt, which runs on the merged embeddings."""
        return start < self.num_prompt_tokens

    def position_ids(self, start: int, num: int) -> np.ndarray:
        """(3, num) M-RoPE positions of tokens start..start+num: the prompt's grid positions, then
        (generated tokens, or a recompute reaching them) 1-D positions shifted by `rope_delta`."""
        assert self.mrope_positions is not None
        positions = np.arange(start, start + num) + self.rope_delta
        in_prompt = max(0, min(start + num, self.num_prompt_tokens) - start)
        out = np.broadcast_to(positions, (3, num)).copy()
        out[:, :in_prompt] = self.mrope_positions[:, start : start + in_prompt]
        return out


def vision_state(
    prompt_token_ids: list[int], images: ImageInputs | None, accepts_images: bool, image_token_id: int | None
) -> VisionState | None:
    """Checks a request's images against its prompt and the model; raises InvalidRequestError. A model
    that names no image token places its image features itself: every prompt block is keyed by the images."""
    if images is None:
        return None
    if not accepts_images:
        raise InvalidRequestError("this model accepts no images; send text only", "messages")
    if image_token_id is None:
        return VisionState(images, list(range(len(prompt_token_ids))), len(prompt_token_ids))
    positions = np.flatnonzero(np.asarray(prompt_token_ids) == image_token_id).tolist()
    if not positions:
        raise InvalidRequestError("the request has images but its prompt has no image tokens", "messages")
    return VisionState(images, positions, len(prompt_token_ids))
