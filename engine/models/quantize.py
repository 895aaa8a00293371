"""Writes an affine-quantized copy of an mlx-lm directory with mlx-lm's own quantization (as `mlx_lm.convert`).

Owns only the copy's contents; where it lives and when it is built is engine/models/default_model.py's.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

_COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def quantize_model_dir(source: Path, out: Path, bits: int, group_size: int, dtype: str) -> None:
    """`source`'s model with every Linear and Embedding whose input width `group_size` divides quantized
    to `bits` bits; the rest (norms, scales and biases) cast to `dtype`, as `mlx_lm.convert --dtype` does
    before quantizing. config.json gains the `quantization` entry `mlx_lm.load` rebuilds the layers from."""
    # Imported here: only a first start needs mlx and mlx-lm for this.
    import mlx.core as mx
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    model, config = load_model(source)
    model.set_dtype(getattr(mx, dtype))
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # mlx-lm prints its bits-per-weight line
        model, config = quantize_model(model, config, group_size, bits, mode="affine")
    logger.info("%s", printed.getvalue().strip().removeprefix("[INFO] "))
    save_model(out, model)
    save_config(config, out / "config.json")
    for name in _COPIED_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
