"""Splits a causal LM into its backbone (hidden states) and its head (logits over the vocabulary), so
a prefill chunk computes logits for its last token only instead of for every prompt token (for a
small model the head is a large share of the weights: SmolLM2-135M's is 28 M of 135 M parameters).

Owns the probe that checks the split reproduces the model's own call; a model whose call does more
than backbone then head (logit soft-capping, scaling, extra inputs) keeps the whole call. Never
touches the KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx import nn

Head = Callable[[mx.array], mx.array]


def split_head(model: nn.Module) -> Head | None:
    """The head to apply to `model.model`'s hidden states, or None where that would not equal
    `model(...)` (checked on a short probe)."""
    backbone = getattr(model, "model", None)
    if not isinstance(backbone, nn.Module):
        return None
    if isinstance(getattr(model, "lm_head", None), nn.Module):
        head: Head = model.lm_head
    elif hasattr(getattr(backbone, "embed_tokens", None), "as_linear"):
        head = backbone.embed_tokens.as_linear
    else:
        return None
    probe = mx.array([[1, 2, 3, 4]], dtype=mx.int32)
    try:
        whole, split = model(probe), head(backbone(probe))
        same = whole.shape == split.shape and mx.array_equal(whole, split).item()
    except (TypeError, ValueError, AttributeError):
        return None
    return head if same else None
