"""Two prefill chunks at once on two MLX streams: the layer loop equals the backbone's call, the BLAS
thread count is restored, chunks pair by length, and an engine that pairs samples what one that
does not samples (its pool writes deferred until both forwards are done)."""

from concurrent.futures import ThreadPoolExecutor

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.core.scheduler import ScheduledRequest
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest
from engine.platform.blas import blas_thread_setter
from engine.runner.cpu.paired_prefill import PairedPrefillPath, make_paired_prefill
from engine.runner.fast_path import Target
from engine.runner.model_head import split_head
from engine.runner.model_runner import pair_chunks

import mlx.core as mx
import pytest
from mlx import nn
from mlx_lm.models.cache import KVCache

from tests.engine.engine_helpers import chat_ids, greedy, run_to_completion, token_ids

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]


def fresh_caches(backbone) -> list[KVCache]:
    return [KVCache() for _ in backbone.layers]


def test_the_layer_loop_reproduces_the_backbone(llm):
    model = llm.runner.model
    paired = make_paired_prefill(model, blas_thread_setter())
    assert paired is not None
    tokens = [mx.array([p], dtype=mx.int32) for p in PROMPTS]
    pair = paired.hidden(tokens, [fresh_caches(model.model) for _ in tokens])
    for ids, hidden in zip(tokens, pair):
        assert mx.array_equal(hidden, model.model(ids, cache=fresh_caches(model.model))).item()


def test_the_load_check_passes_at_two_blas_threads_too(llm):
    # The served config runs 2 BLAS threads, and OpenBLAS splits a matmul over threads in an order of its
    # own: the check must compare the layer loop with a one-thread forward, as the pair runs.
    setter = blas_thread_setter()
    previous = setter(2)
    try:
        assert make_paired_prefill(llm.runner.model, setter) is not None
    finally:
        setter(previous)


def test_a_pair_runs_from_a_thread_other_than_the_one_that_made_it(llm):
    # MLX streams belong to the thread that made them; the Scheduler steps on its own thread.
    model = llm.runner.model
    paired = make_paired_prefill(model, blas_thread_setter())
    tokens = [mx.array([p], dtype=mx.int32) for p in PROMPTS]
    with ThreadPoolExecutor(1) as pool:
        pair = pool.submit(paired.hidden, tokens, [fresh_caches(model.model) for _ in tokens]).result()
    assert mx.array_equal(pair[1], model.model(tokens[1], cache=fresh_caches(model.model))).item()


def test_the_pair_runs_on_one_blas_thread_each_and_restores_the_count(llm):
    calls: list[int] = []

    def setter(num_threads: int) -> int:
        calls.append(num_threads)
        return 2 if len(calls) % 2 else 1  # "2" was the count before each pair

    paired = make_paired_prefill(llm.runner.model, setter)
    assert paired is not None  # the load-time probe ran one pair
    calls.clear()
    tokens = [mx.array([p], dtype=mx.int32) for p in PROMPTS]
    paired.hidden(tokens, [fresh_caches(llm.runner.model.model) for _ in tokens])
    assert calls == [1, 2]


class _ScaledBackbone(nn.Module):
    """Has the parts the layer loop uses, but its own call does more than embed -> layers -> norm."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.embed_tokens, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        return 2 * self.inner(inputs, cache=cache)


class _Model(nn.Module):
    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.model = backbone


def test_no_pairing_off_the_cpu_without_a_head_or_where_the_loop_differs(llm, monkeypatch):
    model, path = llm.runner.model, PairedPrefillPath()
    head = split_head(model)
    assert path.applies(Target(model, llm.storage, "cpu", head)) is None
    assert "CPU" in path.applies(Target(model, llm.storage, "gpu", head))
    assert "head" in path.applies(Target(model, llm.storage, "cpu", None))
    monkeypatch.setattr("engine.runner.cpu.paired_prefill.blas_thread_setter", lambda: None)
    assert "OpenBLAS" in path.applies(Target(model, llm.storage, "cpu", head))
    scaled = _Model(_ScaledBackbone(model.model))
    assert make_paired_prefill(scaled, blas_thread_setter()) is None  # the probe sees the loop differ


def chunk(start: int, num_new: int) -> ScheduledRequest:
    return ScheduledRequest(request=None, start=start, num_new_tokens=num_new)  # type: ignore[arg-type]


def test_chunks_pair_longest_first_with_a_partner_of_similar_length():
    a, b, c, d = chunk(0, 200), chunk(0, 150), chunk(40, 190), chunk(0, 20)
    pairs, left = pair_chunks([a, b, c, d])
    # a takes c (the next longest, within 2x); b's next is d, too short: both run alone.
    assert pairs == [(a, c)] and [s.num_new_tokens for s in left] == [150, 20]
    e, f = chunk(30, 100), chunk(0, 60)  # a chunk with a cached prefix pairs too
    assert pair_chunks([f, e]) == ([(e, f)], [])
    assert pair_chunks([chunk(0, 50)]) == ([], [chunk(0, 50)])


@pytest.fixture(scope="module")
def paired() -> LLMEngine:
    """Without the C forward, which would run the chunks itself (engine/runner/backends.py): the paired
    path serves the models the C forward does not take."""
    return LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=128 << 20, max_num_seqs=16, max_num_batched_tokens=128, cpu_decode=False
        )
    )


@pytest.fixture(scope="module")
def unpaired() -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=128 << 20,
            max_num_seqs=16,
            max_num_batched_tokens=128,
            paired_prefill=False,
            cpu_decode=False,
        )
    )


def test_an_engine_that_pairs_samples_what_one_that_does_not_samples(paired, unpaired):
    llm = paired
    assert llm.runner.paired is not None and unpaired.runner.paired is None
    texts = ["Name three colors.", "What is two plus two?", "Write a haiku about rain.", "Say hi."]
    prompts = [chat_ids(llm, t) for t in texts] + [chat_ids(llm, texts[0]) + chat_ids(llm, texts[1])]
    seen: list[int] = []
    original = llm.runner.paired.hidden

    def counting(tokens, caches):
        seen.append(len(tokens))
        return original(tokens, caches)

    llm.runner.paired.hidden = counting  # type: ignore[method-assign]
    try:
        outs = {}
        for name, engine_ in (("paired", llm), ("unpaired", unpaired)):
            # Arrivals over three steps; chat prompts share the template's system prompt, so most
            # chunks read a cached prefix from the pools.
            arrivals = {0: [], 1: [], 2: []}
            for i, ids in enumerate(prompts):
                arrivals[min(i, 2)].append(GenerateRequest(f"{name}-{i}", ids, greedy(12)))
            result = run_to_completion(engine_, arrivals)
            outs[name] = [token_ids(result[f"{name}-{i}"]) for i in range(len(prompts))]
    finally:
        llm.runner.paired.hidden = original  # type: ignore[method-assign]
    assert seen, "no step paired two chunks"
    assert outs["paired"] == outs["unpaired"]
