"""Every vision architecture of the installed mlx-vlm (tests/vision_architectures.py), as a tiny
random-weight model: the engine's greedy tokens equal mlx-vlm's own generation for one image, two images
and a chunked prefill that splits the image tokens, and another picture changes them (the image reaches
the model); refused architectures fail at load naming what they need."""

from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.models.vision_model import to_mlx
from engine.models.vision_probe import render_user_turn
from engine.prompt.image_processor import ImagePreprocessor

import mlx.core as mx
import pytest

from tests.engine.engine_helpers import run_to_completion, token_ids
from tests.tiny_vlms.common import png_bytes
from tests.tiny_vlms.reference import generate_with_logprobs
from tests.vision_architectures import (
    BUILDERS,
    NOT_BUILDABLE,
    ONE_IMAGE,
    REFUSED,
    installed_vision_architectures,
)

NUM_TOKENS = 8
GREEDY = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
TEXT = "Describe the picture."


def test_every_installed_vision_architecture_is_listed():
    listed = set(BUILDERS) | set(NOT_BUILDABLE)
    assert installed_vision_architectures() - listed == set(), "a new mlx-vlm architecture: add it"
    assert set(BUILDERS) & set(NOT_BUILDABLE) == set()


def _engine(path: str, budget: int) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=path, kv_cache_memory_bytes=16 << 20, block_size=4, max_num_batched_tokens=budget)
    )


def _engine_run(
    llm: LLMEngine, processor: ImagePreprocessor, images: list[bytes]
) -> tuple[list[int], list[float]]:
    """The engine's greedy tokens and their logprobs for one user turn with `images`."""
    ids, inputs = _inputs(processor, images)
    outputs = run_to_completion(llm, {0: [GenerateRequest("r", ids, GREEDY, inputs)]})["r"]
    return token_ids(outputs), [lp.logprob for o in outputs for lp in o.logprobs or []]


def _inputs(processor: ImagePreprocessor, images: list[bytes]):
    return processor.process(render_user_turn(processor.processor, TEXT, len(images)), images, 10**8)


def _mlx_vlm(model, processor: ImagePreprocessor, images: list[bytes]) -> tuple[list[int], list[float]]:
    """mlx-vlm's own greedy generation (tokens, logprobs) on the same processed inputs."""
    ids, inputs = _inputs(processor, images)
    extras = {name: to_mlx(value) for name, value in inputs.extras.items()}
    return generate_with_logprobs(model, mx.array([ids]), to_mlx(inputs.pixel_values), extras, NUM_TOKENS)


def _assert_same(served: tuple[list[int], list[float]], reference: tuple[list[int], list[float]]) -> None:
    assert served[0] == reference[0]
    assert served[1] == pytest.approx(reference[1], abs=2e-3)


@pytest.mark.parametrize("model_type", sorted(BUILDERS))
def test_engine_equals_mlx_vlm(model_type, tmp_path_factory):
    path = str(BUILDERS[model_type](tmp_path_factory.mktemp(model_type), 0))
    if model_type in REFUSED:
        with pytest.raises(ModelLoadError, match=REFUSED[model_type]):
            _engine(path, 512)
        return
    from mlx_vlm.utils import load_model

    reference = load_model(Path(path))
    one, other, two = [png_bytes(1)], [png_bytes(2)], [png_bytes(1), png_bytes(3, (40, 56))]
    llm = _engine(path, 512)
    processor = llm.runner.model.preprocessor  # the one the load probe used
    expected = _mlx_vlm(reference, processor, one)
    _assert_same(first := _engine_run(llm, processor, one), expected)
    _assert_same(other_run := _engine_run(llm, processor, other), _mlx_vlm(reference, processor, other))
    assert other_run != first  # the picture reaches the output
    if model_type not in ONE_IMAGE:
        _assert_same(_engine_run(llm, processor, two), _mlx_vlm(reference, processor, two))
    llm.scheduler.max_num_batched_tokens = 5  # prompt chunks of 5 tokens: the image tokens span several
    _assert_same(_engine_run(llm, processor, one), expected)
