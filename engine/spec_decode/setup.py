"""Builds what `EngineConfig.speculative` asks for at load: the drafter, its cache's share of the KV
budget, and a clear error where the model cannot serve it.

Owns the load-time checks only; engine/spec_decode/speculator.py runs the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig
from engine.models.model_loader import LoadedModel, load_model
from engine.runner import backends
from engine.runner.fast_path import Target
from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.layer_caches import LayerCaches
from engine.runner.model_head import split_head
from engine.spec_decode.draft_model import DraftModel, DraftModelError

import mlx_lm


class SpeculativeConfigError(ValueError):
    pass


@dataclass
class DraftLoad:
    """A draft model loaded and checked, before its pools exist (their size depends on the budget)."""

    loaded: LoadedModel
    layers: LayerCaches
    shapes: list[LayerShape]

    def bytes_per_block(self, config: EngineConfig) -> int:
        return KVStorage.bytes_per_block(
            self.shapes, config.block_size, self.loaded.dtype, config.kv_cache_dtype
        )


def check_target(config: EngineConfig, model_layers: LayerCaches) -> None:
    """Raises SpeculativeConfigError where the model cannot verify drafts."""
    spec = config.speculative
    assert spec is not None
    if spec.method == "mtp":
        raise SpeculativeConfigError(
            f"speculative.method mtp: mlx-lm {mlx_lm.__version__} drops the multi-token-prediction weights "
            "of every architecture when it loads a checkpoint, so this model has no MTP head to draft "
            "with; use method ngram or draft_model"
        )
    if model_layers.has_state:
        raise SpeculativeConfigError(
            f"speculative decoding needs a cache that can drop rejected drafts; this model keeps "
            f"recurrent state ({model_layers.kinds_summary}), which a rejected draft would corrupt. "
            "Remove engine.speculative"
        )


def load_draft(config: EngineConfig, vocab: dict[str, int]) -> DraftLoad | None:
    """The draft model of `speculative.method: draft_model`, checked against the model's vocabulary."""
    spec = config.speculative
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None
    loaded = load_model(replace_model(config, spec.model))
    layers = LayerCaches(loaded.model)
    try:
        DraftModel.check(loaded, layers, vocab)
    except DraftModelError as exc:
        raise SpeculativeConfigError(str(exc)) from exc
    shapes, _ = layers.probe_shapes()
    return DraftLoad(loaded, layers, shapes)


def replace_model(config: EngineConfig, model: str) -> EngineConfig:
    """The engine settings with another model and no speculation: how the draft model loads."""
    return config.model_copy(update={"model": model, "speculative": None, "served_model_name": None})


def build_draft(draft: DraftLoad, config: EngineConfig, num_blocks: int, vocab_size: int) -> DraftModel:
    """The draft with its pools (over the model's block ids) and the fast paths its device offers."""
    loaded = draft.loaded
    storage = KVStorage(draft.shapes, num_blocks, config.block_size, loaded.dtype, config.kv_cache_dtype)
    choice = backends.choose(
        Target(loaded.model, storage, loaded.device, split_head(loaded.model)),
        config,
    )
    return DraftModel(loaded, draft.layers, storage, vocab_size, choice)


def describe(config: EngineConfig) -> str:
    """What /v1/status shows: "off", or the method and its draft size."""
    spec = config.speculative
    if spec is None:
        return "off"
    k = f"{spec.num_speculative_tokens} tokens"
    if spec.method == "ngram":
        return f"ngram, {k} (prompt lookup of {spec.prompt_lookup_min}-{spec.prompt_lookup_max} tokens)"
    return f"draft_model {spec.model}, {k}"
