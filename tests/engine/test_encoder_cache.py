"""The vision encoder cache: bounded by bytes, least recently used out; a conversation that resends its
picture reuses the encoded rows and answers exactly as an engine without the cache; a text request
never touches it."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.models.encoder_cache import EncoderCache, ImageRows
from engine.models.vision_probe import render_messages, render_user_turn
from engine.prompt.image_processor import ImagePreprocessor

import mlx.core as mx
import pytest

from tests.engine.engine_helpers import run_to_completion, token_ids
from tests.tiny_vlms.common import png_bytes
from tests.tiny_vlms.core import build_gemma3, build_qwen3_vl

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)


def _rows(num_bytes: int) -> ImageRows:
    return ImageRows(mx.zeros((num_bytes // 4,), dtype=mx.float32), None)


def test_cache_keeps_the_most_recently_used_within_its_bytes():
    cache = EncoderCache(max_bytes=300)
    cache.put("a", _rows(100))
    cache.put("b", _rows(100))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", _rows(200))  # over the bound: b, the least recent, goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put("huge", _rows(400))  # larger than the whole cache: not kept, nothing evicted
    assert cache.get("huge") is None and cache.num_bytes == 300
    assert (cache.num_queries, cache.num_hits) == (5, 3)


@pytest.fixture(scope="module", params=["qwen3_vl", "gemma3"])
def vlm_dir(request, tmp_path_factory) -> str:
    """Qwen3-VL (M-RoPE positions and DeepStack features rebuilt too), Gemma 3 (its 4-D mask dropped)."""
    build = {"qwen3_vl": build_qwen3_vl, "gemma3": build_gemma3}[request.param]
    return str(build(tmp_path_factory.mktemp(request.param), 0))


def _engine(path: str, cache_bytes: int) -> LLMEngine:
    config = EngineConfig(
        model=path, kv_cache_memory_bytes=16 << 20, block_size=4, encoder_cache_bytes=cache_bytes
    )
    return LLMEngine(config)


def _conversation(processor: ImagePreprocessor, turns: int):
    """A chat that sends the same picture on every turn, `turns` user turns long."""
    image = {"type": "image"}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
    for turn in range(1, turns):
        messages += [
            {"role": "assistant", "content": f"Answer {turn}."},
            {"role": "user", "content": "More?"},
        ]
    text = render_messages(processor.processor, messages)
    return processor.process(text, [png_bytes(5)], 10**8)


def test_a_resent_picture_is_not_encoded_again_and_answers_the_same(vlm_dir):
    processor = ImagePreprocessor.load(vlm_dir)
    cached, uncached = _engine(vlm_dir, 64 << 20), _engine(vlm_dir, 0)
    assert "encoder cache on" in cached.compute.vision
    assert uncached.encoder_cache is None and "encoder cache off" in uncached.compute.vision
    for turns in (1, 2, 3):
        ids, images = _conversation(processor, turns)
        runs = [
            run_to_completion(llm, {0: [GenerateRequest("r", ids, GREEDY, images)]})["r"]
            for llm in (cached, uncached)
        ]
        assert token_ids(runs[0]) == token_ids(runs[1])
        logprobs = [[lp.logprob for o in run for lp in o.logprobs] for run in runs]
        assert logprobs[0] == pytest.approx(logprobs[1], abs=1e-4)
    stats = cached.stats()
    assert (stats.encoder_cache_queries, stats.encoder_cache_hits) == (3, 2)


def test_text_only_requests_never_touch_the_cache(vlm_dir):
    llm = _engine(vlm_dir, 64 << 20)
    ids = llm.tokenizer.encode(render_user_turn(ImagePreprocessor.load(vlm_dir).processor, "Hello", 0))
    run_to_completion(llm, {0: [GenerateRequest("t", ids, GREEDY)]})
    assert llm.stats().encoder_cache_queries == 0
