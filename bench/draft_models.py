"""Draft models for speculative decoding made from the bundled one: its first N layers and its head, so
they share its tokenizer exactly (`speculative: {method: draft_model, model: <dir>}`).

    python bench/draft_models.py --layers 6 --out /tmp/smollm2-draft-6

A draft of a few layers of the same model agrees with it on easy tokens, which is what the acceptance
path needs exercising; a trained small sibling (a 135M draft for a 1.7B model) drafts better.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse
import shutil

_COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
)


def write_layer_prefix(source: Path, out: Path, num_layers: int) -> Path:
    """An mlx-lm directory at `out` holding `source`'s model cut to its first `num_layers` layers."""
    from mlx_lm.utils import load_model, save_config, save_model

    model, config = load_model(source)
    if not 0 < num_layers <= len(model.model.layers):
        raise ValueError(f"num_layers {num_layers} is outside [1, {len(model.model.layers)}]")
    total = len(model.model.layers)
    model.model.layers = model.model.layers[:num_layers]
    config["num_hidden_layers"] = num_layers
    for key, value in config.items():  # per-layer lists (layer_types, ...) keep their first entries
        if isinstance(value, list) and len(value) == total:
            config[key] = value[:num_layers]
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(config, out / "config.json")
    for name in _COPIED_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    return out


def bundled_draft(out: Path, num_layers: int) -> Path:
    """The bundled model's first `num_layers` layers at `out` (built once)."""
    from engine.models.default_model import ensure_default_model

    if (out / "config.json").is_file():
        return out
    return write_layer_prefix(ensure_default_model("float32"), out, num_layers)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(bundled_draft(args.out, args.layers))


if __name__ == "__main__":
    main()
