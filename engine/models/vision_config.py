"""What a checkpoint's config.json says about vision: whether it is an mlx-vlm model, and its image
placeholder token. Reads config dicts only; loads nothing but mlx-vlm's config class for a default."""

from __future__ import annotations

from typing import Any


def is_vision_config(config: dict[str, Any]) -> bool:
    """mlx-vlm checkpoints carry a vision tower config (at the top, or in an omni model's thinker);
    mlx-lm ones never do."""
    nested = [value for value in config.values() if isinstance(value, dict)]
    return any(isinstance(c.get("vision_config"), dict) for c in [config, *nested])


def image_token_id(config: dict[str, Any]) -> int | None:
    """The image placeholder's id: from the checkpoint's config, else the mlx-vlm model config's default;
    None where the model names none (it places its image features itself)."""
    for source in (config, config.get("text_config") or {}):
        for key in ("image_token_id", "image_token_index"):
            if isinstance(source.get(key), int):
                return source[key]
    from mlx_vlm.utils import get_model_and_args

    module, _ = get_model_and_args(config=dict(config))
    model_config = module.ModelConfig.from_dict(config)
    for key in ("image_token_id", "image_token_index"):
        if isinstance(getattr(model_config, key, None), int):
            return getattr(model_config, key)
    return None
