"""A vision-language model on the paged engine: a tiny random-weight SmolVLM (tests/tiny_vlm.py) with its
real processor. Images are decoded, processed, embedded; generation equals mlx-vlm's own; VLM requests
batch with text requests; blocks are freed; the prefix cache tells images apart."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.core.vision_state import vision_state
from engine.errors import InvalidRequestError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, ImageInputs, SamplingParams
from engine.prompt.image_processor import ImagePreprocessor

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.models.cache import KVCache

from tests.engine.engine_helpers import run_to_completion, token_ids
from tests.tiny_vlm import IMAGE_SEQ_LEN, build_tiny_vlm, image_prompt, png_bytes, small_engine_config

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm")))


@pytest.fixture(scope="module")
def vlm(vlm_dir) -> LLMEngine:
    return LLMEngine(small_engine_config(vlm_dir))


@pytest.fixture(scope="module")
def processor(vlm_dir) -> ImagePreprocessor:
    return ImagePreprocessor.load(vlm_dir)


def _reference_greedy(llm: LLMEngine, ids: list[int], images: ImageInputs, max_tokens: int) -> list[int]:
    """mlx-vlm's own path: the whole prompt's merged embeddings through its language model and KV cache."""
    model = llm.runner.model
    cache = [KVCache() for _ in model.layers]
    embeds = model.features(ids, images.pixel_values, images.extras)["inputs_embeds"]
    logits = model.language_model(mx.array([ids]), inputs_embeds=embeds, cache=cache).logits
    tokens = []
    for _ in range(max_tokens):
        tokens.append(int(mx.argmax(logits[0, -1])))
        logits = model.language_model(mx.array([[tokens[-1]]]), cache=cache).logits
    return tokens


def test_image_is_decoded_processed_and_expanded(processor):
    ids, images = image_prompt(processor, "What is this?", [png_bytes(1), png_bytes(2, (20, 90))])
    image_token_id = processor.processor.image_token_id
    assert ids.count(image_token_id) == 2 * IMAGE_SEQ_LEN
    assert images.pixel_values.shape == (1, 2, 3, 32, 32) and images.pixel_values.dtype == np.float32
    assert images.num_images == 2 and len(images.image_hash) == 64


def test_bytes_that_are_no_image_and_huge_images_are_refused(processor):
    with pytest.raises(InvalidRequestError, match="image 1 could not be decoded"):
        image_prompt(processor, "hi", [b"GIF89a but not really"])
    with pytest.raises(InvalidRequestError, match="above the limit"):
        processor.process("<image>", [png_bytes(1, (300, 300))], max_pixels=300 * 299)


def test_generation_equals_mlx_vlm_reference(vlm, processor):
    ids, images = image_prompt(processor, "Describe the picture.", [png_bytes(3)])
    outputs = run_to_completion(vlm, {0: [GenerateRequest("ref", ids, GREEDY, images)]})["ref"]
    assert token_ids(outputs) == _reference_greedy(vlm, ids, images, 8)
    assert outputs[-1].finish_reason == "length"
    assert vlm.pool.num_free == vlm.pool.num_blocks  # every block freed (cached ones sit in the free queue)


def test_image_request_batches_with_a_text_request_in_one_step(vlm, processor):
    ids, images = image_prompt(processor, "Look.", [png_bytes(4)])
    text_ids = vlm.tokenizer.encode("Plain text, no picture at all.")
    alone = {
        "img": run_to_completion(vlm, {0: [GenerateRequest("img", ids, GREEDY, images)]})["img"],
        "txt": run_to_completion(vlm, {0: [GenerateRequest("txt", text_ids, GREEDY)]})["txt"],
    }
    vlm.add_request(GenerateRequest("img2", ids, GREEDY, images))
    vlm.add_request(GenerateRequest("txt2", text_ids, GREEDY))
    outputs: dict[str, list] = {}
    num_shared_steps = 0
    while vlm.has_unfinished_requests():
        before = _progress(vlm)
        for output in vlm.step():
            outputs.setdefault(output.request_id, []).append(output)
        after = _progress(vlm)
        num_shared_steps += all(after.get(r, 10**9) > before.get(r, 10**9) for r in ("img2", "txt2"))
    assert num_shared_steps > 0  # some step computed tokens of both requests
    assert token_ids(outputs["img2"]) == token_ids(alone["img"])
    assert token_ids(outputs["txt2"]) == token_ids(alone["txt"])
    assert vlm.pool.num_free == vlm.pool.num_blocks


def _progress(llm: LLMEngine) -> dict[str, int]:
    return {r.request_id: r.num_computed_tokens for r in llm.scheduler.running}


def test_same_image_shares_prefix_blocks_and_another_image_does_not(vlm, processor):
    ids_a, images_a = image_prompt(processor, "Which colour dominates here?", [png_bytes(10)])
    ids_b, images_b = image_prompt(processor, "Which colour dominates here?", [png_bytes(11)])
    assert ids_a == ids_b  # the same token ids: only the pixels differ
    first = run_to_completion(vlm, {0: [GenerateRequest("a1", ids_a, GREEDY, images_a)]})["a1"]
    again = run_to_completion(vlm, {0: [GenerateRequest("a2", ids_a, GREEDY, images_a)]})["a2"]
    other = run_to_completion(vlm, {0: [GenerateRequest("b1", ids_b, GREEDY, images_b)]})["b1"]
    first_image_block = ids_a.index(vlm.image_token_id) // vlm.config.block_size
    assert again[-1].num_cached_tokens > first_image_block * vlm.config.block_size
    assert other[-1].num_cached_tokens == first_image_block * vlm.config.block_size
    assert token_ids(again) == token_ids(first)
    assert token_ids(other) == _reference_greedy(vlm, ids_b, images_b, 8)


def test_text_only_model_refuses_images(llm):
    images = ImageInputs(np.zeros((1, 1, 3, 4, 4), np.float32), {}, "h", 1)
    with pytest.raises(InvalidRequestError, match="accepts no images"):
        llm.add_request(GenerateRequest("x", [1, 2, 3], GREEDY, images))


def test_block_key_marks_only_blocks_with_image_tokens():
    images = ImageInputs(np.zeros((1,), np.float32), {}, "abc", 1)
    state = vision_state([5, 5, 9, 9, 5, 5], images, True, image_token_id=9)
    assert state.block_key(0, 2) is None and state.block_key(4, 6) is None
    assert state.block_key(2, 4) is not None and state.block_key(0, 3) == state.block_key(2, 4)
    with pytest.raises(InvalidRequestError, match="no image tokens"):
        vision_state([5, 5], images, True, image_token_id=9)
