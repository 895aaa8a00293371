"""The engine on the real bundled model: output equals mlx-lm's own greedy decoding."""

from dataclasses import replace

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, StructuredOutputs
from engine.runner.cpu import window_attention

import pytest

from tests.engine.engine_helpers import chat_ids, greedy, reference_greedy, run_to_completion, token_ids

PROMPTS = [
    "What is the capital of France?",
    "Name three colours.",
    "Write a haiku about the sea and the wind over the waves at night.",
    "What is 2 + 2?",
    "Tell me a fact about cats.",
    "Explain in one sentence what a compiler does, and why programmers use one every day.",
    "Hi",
    "List the planets of the solar system in order from the sun, starting with Mercury.",
]


def _strip_eos(llm: LLMEngine, tokens: list[int]) -> list[int]:
    return [t for t in tokens if t not in llm.eos_token_ids]


@pytest.fixture(params=["sync", "async"])
def any_llm(request) -> LLMEngine:
    """Each correctness test runs with host sampling every step and with asynchronous scheduling."""
    return request.getfixturevalue("llm" if request.param == "sync" else "async_llm")


def test_single_request_equals_mlx_lm_greedy_and_mentions_paris(any_llm):
    llm = any_llm
    prompt = chat_ids(llm, PROMPTS[0])
    outputs = run_to_completion(llm, {0: [GenerateRequest("one", prompt, greedy(24))]})["one"]
    assert _strip_eos(llm, token_ids(outputs)) == reference_greedy(llm, prompt, 24)
    assert "Paris" in "".join(o.new_text for o in outputs)
    assert outputs[-1].finish_reason in ("stop", "length")
    # Cached prefix blocks sit in the free queue, so every block counts as free again.
    assert llm.pool.num_free == llm.pool.num_blocks


# Asynchronous scheduling changes when tokens are read, not how attention runs: it takes one path.
@pytest.mark.parametrize(
    ("any_llm", "path"),
    [("sync", "c-decode"), ("sync", "kv-in-place"), ("sync", "kv-gathered"), ("async", "c-decode")],
    indirect=["any_llm"],
)
def test_staggered_batch_of_eight_equals_reference(any_llm, path, monkeypatch):
    llm = any_llm
    assert llm.runner.choice.names["decode"] == "c_forward", "the bundled model decodes in C (cpu_decode.py)"
    assert llm.runner.attention.in_place is not None, "the bundled model's attention reads K/V in place"
    if path != "c-decode":
        monkeypatch.setattr(llm.runner, "decode", None)
    if path == "kv-gathered":
        monkeypatch.setattr(llm.runner, "attention", replace(llm.runner.attention, in_place=None))
    reads, c_steps = [], []
    monkeypatch.setattr(
        window_attention, "window_attention", _counting(window_attention.window_attention, reads)
    )
    if path == "c-decode":
        monkeypatch.setattr(llm.runner.decode, "step", _counting(llm.runner.decode.step, c_steps))
    prompts = [chat_ids(llm, p) for p in PROMPTS]
    arrivals = {i * 3: [GenerateRequest(f"b{i}", p, greedy(20))] for i, p in enumerate(prompts)}
    outputs = run_to_completion(llm, arrivals)
    for i, prompt in enumerate(prompts):
        assert _strip_eos(llm, token_ids(outputs[f"b{i}"])) == reference_greedy(llm, prompt, 20), PROMPTS[i]
    assert llm.pool.num_free == llm.pool.num_blocks
    assert bool(reads) == (path == "kv-in-place")
    assert bool(c_steps) == (path == "c-decode")


def _counting(fn, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return counted


def test_prefix_cache_hit_gives_same_output_and_counts_hits(any_llm):
    llm = any_llm
    system = "You are a helpful assistant who answers briefly. " * 6
    first = chat_ids(llm, system + "What is the capital of Italy?")
    second = chat_ids(llm, system + "What is the capital of Spain?")
    run_to_completion(llm, {0: [GenerateRequest("p1", first, greedy(8))]})
    hits_before = llm.kv.prefix_hits
    outputs = run_to_completion(llm, {0: [GenerateRequest("p2", second, greedy(16))]})["p2"]
    assert outputs[-1].num_cached_tokens >= 48
    assert llm.kv.prefix_hits - hits_before >= 48
    assert _strip_eos(llm, token_ids(outputs)) == reference_greedy(llm, second, 16)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_forced_preemption_keeps_greedy_output(async_scheduling: bool):
    small = LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=14 * 737_280,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            max_model_len=128,
            async_scheduling=async_scheduling,
        )
    )
    prompts = [chat_ids(small, p) for p in PROMPTS[:6]]
    outputs = run_to_completion(
        small, {0: [GenerateRequest(f"q{i}", p, greedy(24)) for i, p in enumerate(prompts)]}
    )
    assert small.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts):
        assert _strip_eos(small, token_ids(outputs[f"q{i}"])) == reference_greedy(small, prompt, 24)
    assert small.pool.num_free == small.pool.num_blocks


def test_abort_frees_blocks_at_once(any_llm):
    llm = any_llm
    prompt = chat_ids(llm, PROMPTS[5])
    llm.add_request(GenerateRequest("gone", prompt, greedy(200)))
    for _ in range(3):
        llm.step()
    assert llm.pool.num_used > 0
    llm.abort_request("gone")
    outputs = llm.step()
    assert [o.finish_reason for o in outputs if o.request_id == "gone"] == ["abort"]
    assert llm.pool.num_used == 0 and not llm.has_unfinished_requests()


def test_an_output_cut_inside_a_character_never_ends_in_a_broken_one(llm):
    """max_tokens stops an output on a byte-level token holding part of an emoji's or a CJK character's
    bytes: the output ends before that character, as every batch so far streamed it."""
    target = "Fox 🦊 猫"
    forced = StructuredOutputs(grammar=f'start: "{target}"')
    prompt = chat_ids(llm, "Say something.")
    requests = [
        GenerateRequest(f"cut{k}", prompt, replace(greedy(k), structured=forced)) for k in range(1, 9)
    ]
    outputs = run_to_completion(llm, {0: requests})
    cut_inside = 0
    for request in requests:
        text = "".join(o.new_text for o in outputs[request.request_id])
        assert "\ufffd" not in text and target.startswith(text), (request.request_id, text)
        cut_inside += llm.tokenizer.decode(token_ids(outputs[request.request_id])).endswith("\ufffd")
    assert cut_inside, "no max_tokens fell inside a character"
