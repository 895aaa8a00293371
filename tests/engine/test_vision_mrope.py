"""M-RoPE vision-language models on the paged engine: tiny random-weight Qwen2-VL and Qwen2.5-VL
(tests/tiny_vlm.py) with their real processor. Image tokens sit on a (time, height, width) position grid and every later
token is shifted; the engine's chunked, batched prefill and decode must place them as mlx-vlm does."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.core.vision_state import VisionState
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, ImageInputs, RequestOutput, SamplingParams
from engine.prompt.image_processor import ImagePreprocessor

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.models.cache import KVCache

from tests.engine.engine_helpers import run_to_completion, token_ids
from tests.tiny_vlm import build_tiny_qwen2_vl, image_prompt, png_bytes, small_engine_config

NUM_TOKENS = 8
GREEDY = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
TOLERANCE = 2e-4


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def qwen_dir(request, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return str(build_tiny_qwen2_vl(out, model_type=request.param))


@pytest.fixture(scope="module")
def qwen(qwen_dir) -> LLMEngine:
    return LLMEngine(small_engine_config(qwen_dir))


@pytest.fixture(scope="module")
def processor(qwen_dir) -> ImagePreprocessor:
    return ImagePreprocessor.load(qwen_dir)


def _reference(llm: LLMEngine, ids: list[int], images: ImageInputs, one_d: bool = False) -> list[float]:
    """Greedy logprobs of mlx-vlm's own model call (it computes the M-RoPE positions itself); `one_d`
    places every token at its 1-D index instead, the mistake the engine must not make."""
    vlm = llm.runner.model.vlm
    cache = [KVCache() for _ in vlm.layers]
    extras = {name: mx.array(value) for name, value in images.extras.items()}
    if one_d:
        embeds = vlm.get_input_embeddings(
            mx.array([ids]), mx.array(images.pixel_values), **extras
        ).inputs_embeds
        positions = mx.broadcast_to(mx.arange(len(ids))[None, None], (3, 1, len(ids)))
        logits = vlm.language_model(mx.array([ids]), embeds, cache=cache, position_ids=positions).logits
    else:
        logits = vlm(mx.array([ids]), mx.array(images.pixel_values), cache=cache, **extras).logits
    logprobs = []
    for step in range(NUM_TOKENS):
        row = logits[0, -1].astype(mx.float32)
        token = int(mx.argmax(row))
        logprobs.append(float(row[token] - mx.logsumexp(row)))
        position = len(ids) + step
        kwargs = {"position_ids": mx.full((3, 1, 1), position)} if one_d else {}
        logits = vlm.language_model(mx.array([[token]]), cache=cache, **kwargs).logits
    return logprobs


def _logprobs(outputs: list[RequestOutput]) -> list[float]:
    return [entry.logprob for o in outputs for entry in o.logprobs or []]


def test_images_expand_to_their_merged_grid(processor):
    ids, images = image_prompt(processor, "What is this?", [png_bytes(1, (90, 40)), png_bytes(2, (56, 56))])
    grid = images.extras["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 6], [1, 4, 4]]  # 90x40 -> 84x56 pixels (w x h); 56x56 stays
    assert ids.count(processor.processor.image_token_id) == 6 + 4  # one token per 2x2 patches


def test_generation_equals_mlx_vlm_with_chunked_prefill(qwen, processor):
    ids, images = image_prompt(
        processor, "Describe both pictures.", [png_bytes(3, (90, 40)), png_bytes(4, (40, 90))]
    )
    assert len(ids) > 3 * qwen.config.max_num_batched_tokens  # the prefill runs in chunks
    outputs = run_to_completion(qwen, {0: [GenerateRequest("ref", ids, GREEDY, images)]})["ref"]
    expected = _reference(qwen, ids, images)
    assert np.allclose(_logprobs(outputs), expected, atol=TOLERANCE)
    # The comparison can fail: 1-D positions give other logprobs.
    assert not np.allclose(_reference(qwen, ids, images, one_d=True), expected, atol=10 * TOLERANCE)
    assert qwen.pool.num_free == qwen.pool.num_blocks


def test_image_requests_batch_with_text_and_each_other(qwen, processor):
    first = image_prompt(processor, "Look.", [png_bytes(5, (90, 40))])
    second = image_prompt(processor, "And this one, in more words?", [png_bytes(6)])
    text_ids = qwen.tokenizer.encode("Plain text, no picture at all.")
    requests = [
        GenerateRequest("img-a", *first[:1], GREEDY, first[1]),
        GenerateRequest("txt", text_ids, GREEDY),
        GenerateRequest("img-b", *second[:1], GREEDY, second[1]),
    ]
    alone = {r.request_id: run_to_completion(qwen, {0: [r]})[r.request_id] for r in requests}
    together = run_to_completion(qwen, {0: requests[:2], 2: requests[2:]})
    for request in requests:
        rid = request.request_id
        assert token_ids(together[rid]) == token_ids(alone[rid])
        assert np.allclose(_logprobs(together[rid]), _logprobs(alone[rid]), atol=TOLERANCE)
    assert np.allclose(_logprobs(alone["img-a"]), _reference(qwen, *first), atol=TOLERANCE)
    assert qwen.pool.num_free == qwen.pool.num_blocks


def test_positions_past_the_prompt_are_shifted_by_the_delta():
    grid_positions = np.array([[0, 1, 1, 1, 1, 3], [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 3]])
    state = VisionState(ImageInputs(np.zeros(1), {}, "h", 1), [1, 2, 3, 4], num_prompt_tokens=6)
    state.mrope_positions, state.rope_delta = grid_positions, -2
    # A recompute chunk that spans the prompt's end and the generated tokens after it.
    assert state.position_ids(4, 4).tolist() == [[1, 3, 4, 5], [2, 3, 4, 5], [2, 3, 4, 5]]
    assert state.position_ids(9, 1).tolist() == [[7], [7], [7]]
