"""Every vision architecture of the installed mlx-vlm, one list: a tiny builder for each one the engine
serves (tests/tiny_vlms/), the reason for each one it refuses at load, and what mlx-vlm itself cannot
run here. tests/engine/test_vision_architectures.py checks every entry against mlx-vlm's own generation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from tests.tiny_vlms import (
    cohere,
    core,
    deepseek,
    gemma,
    glm,
    internvl,
    kimi,
    llama_phi,
    llava,
    mamba_hybrids,
    minicpm,
    moe_hybrids,
    molmo,
    muse,
    navit,
    not_buildable,
    ocr,
    qwen,
)

BUILDERS: dict[str, Callable[[Path, int], Path]] = {**core.BUILDERS}

# Built, and refused by the engine at load with this reason (a fragment of the error).
REFUSED: dict[str, str] = {
    "cohere_compass": r"its own attention mask over the prompt \(attention_mask\) with a prompt computed in chunks",
    "glm5_next": r"its own attention mask over the prompt \(attention_mask\) with a prompt computed in chunks",
    "gemma4": r"per-layer token inputs next to the embeddings \(per_layer_inputs\) with a prompt computed",
    "florence2": r"an encoder-decoder language model",
    "nemotron_parse": r"an encoder-decoder language model",
    "mllama": r"cross-attention to the image states at every decode step",
    "granite4_vision": r"DeepStack features laid out over the whole prompt",
    "qwen3_omni_moe": r"DeepStack features laid out over the whole prompt",
    "granite_vision": r"image features that change the prompt's length",
    "llava_next": r"image features that change the prompt's length",
    "llava_bunny": r"image features that change the prompt's length",
    "phi4mm": r"image features that change the prompt's length",
    "multi_modality": r"image features that change the prompt's length",
    "minicpmo": r"keeps M-RoPE positions inside its language model",
    "molmo_point": r"a token embedding layer the engine can find",
    "plamo2vl": r"tokenizer does not load through transformers",
}

# Served, but the model's own processor (so mlx-vlm too) takes one image per prompt.
ONE_IMAGE: dict[str, str] = {
    "step3p7": "its processor wants one <im_patch> placeholder per image and pools each to 169 tokens",
    "molmo": "its processor turns two images into two batch rows",
    "moondream3": "its processor makes a batch of 2 for two images",
    "florence2": "its processor takes one image",
    "got": "its processor expands one image to 256 positions",
    "nemotron_parse": "its processor takes one page",
}

# Not built: mlx-vlm itself cannot run the architecture here, or it generates no text.
NOT_BUILDABLE: dict[str, str] = {}

FAMILIES = (
    cohere,
    deepseek,
    gemma,
    glm,
    internvl,
    kimi,
    llama_phi,
    llava,
    mamba_hybrids,
    minicpm,
    moe_hybrids,
)
FAMILIES += (molmo, muse, navit, not_buildable, ocr, qwen)
for _module in FAMILIES:
    BUILDERS.update(_module.BUILDERS)
    NOT_BUILDABLE.update(_module.NOT_BUILDABLE)


def installed_vision_architectures() -> set[str]:
    """mlx-vlm's model folders whose code configures a vision tower (`vision_config`)."""
    import mlx_vlm.models

    root = Path(mlx_vlm.models.__file__).parent
    found = set()
    for folder in root.iterdir():
        sources = [p.read_text(errors="ignore") for p in folder.glob("*.py")] if folder.is_dir() else []
        if any(re.search(r"\bvision_config\b", source) for source in sources):
            found.add(folder.name)
    return found
