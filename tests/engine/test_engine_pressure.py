"""The engine under KV pressure and bad rows, on the real bundled model.

More work than the KV budget holds: requests wait or are preempted and recomputed, and every greedy
output equals the unpressured engine's; aborts mid-way and shared prefixes return every block to the
pool. A request whose sampling raises fails alone; the other rows of its batch go on.
(tests/engine/test_llm_engine.py holds the basic forced-preemption case; this one adds prefixes,
aborts, the waiting-queue bound and the failing row.)
"""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.errors import QueueFullError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

import pytest

from tests.engine.engine_helpers import chat_ids, greedy, run_to_completion, token_ids

SYSTEM = "You are a terse assistant. Answer in one short sentence and never add a greeting. " * 3
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "What is 2 + 2?",
    "Tell me a fact about cats.",
    "What does a compiler do?",
    "Which planet is the largest?",
    "Why is the sky blue?",
    "Name a fruit that is yellow.",
]
# Per-block bytes of the bundled model's float32 KV (tests/engine/test_llm_engine.py uses the same).
BLOCK_BYTES = 737_280


@pytest.fixture(scope="module")
def tiny() -> LLMEngine:
    """20 blocks of 16 tokens: one shared-prefix prompt (~70 tokens) plus 40 outputs needs 7 blocks,
    so eight at once (56 blocks) cannot all hold their KV and must wait or be preempted."""
    config = EngineConfig(
        kv_cache_memory_bytes=20 * BLOCK_BYTES, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=160
    )
    return LLMEngine(config)


def _prompts(llm: LLMEngine) -> list[list[int]]:
    # Half share a long system prompt (prefix-cache hits under eviction), half do not.
    return [chat_ids(llm, (SYSTEM if i % 2 == 0 else "") + q) for i, q in enumerate(QUESTIONS)]


def _greedy_outputs(llm: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, list[int]]:
    arrivals = {0: [GenerateRequest(f"r{i}", p, greedy(max_tokens)) for i, p in enumerate(prompts)]}
    return {rid: token_ids(outs) for rid, outs in run_to_completion(llm, arrivals).items()}


def test_pressure_waits_or_preempts_and_output_equals_the_unpressured_run(llm, tiny):
    prompts = _prompts(tiny)
    assert chat_ids(llm, QUESTIONS[0]) == chat_ids(tiny, QUESTIONS[0])  # same model, same tokens
    unpressured = _greedy_outputs(llm, prompts, 40)
    preemptions_before = tiny.scheduler.num_preemptions
    pressured = _greedy_outputs(tiny, prompts, 40)
    num_preemptions = tiny.scheduler.num_preemptions - preemptions_before
    print(f"pressure: 8 requests on {tiny.pool.num_blocks} blocks, {num_preemptions} preemptions")
    assert num_preemptions > 0
    assert pressured == unpressured
    assert tiny.pool.num_free == tiny.pool.num_blocks and not tiny.has_unfinished_requests()


def test_aborts_under_pressure_return_every_block(tiny):
    prompts = _prompts(tiny)
    for i, prompt in enumerate(prompts):
        long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
        tiny.add_request(GenerateRequest(f"a{i}", prompt, long))
    finished: dict[str, str] = {}
    for step in range(2000):
        if step == 10:  # half of them leave mid-stream, some while waiting, some while running
            for i in range(0, len(prompts), 2):
                tiny.abort_request(f"a{i}")
        for out in tiny.step():
            if out.finished:
                finished[out.request_id] = out.finish_reason
        if not tiny.has_unfinished_requests():
            break
    assert len(finished) == len(prompts)
    assert {finished[f"a{i}"] for i in range(0, len(prompts), 2)} == {"abort"}
    assert {finished[f"a{i}"] for i in range(1, len(prompts), 2)} == {"length"}
    assert tiny.pool.num_free == tiny.pool.num_blocks


def test_a_full_waiting_queue_refuses_with_queue_full():
    bounded = LLMEngine(
        EngineConfig(kv_cache_memory_bytes=20 * BLOCK_BYTES, max_num_seqs=1, max_waiting_requests=2)
    )
    prompt = chat_ids(bounded, QUESTIONS[0])
    bounded.add_request(GenerateRequest("w0", prompt, greedy(4)))
    bounded.add_request(GenerateRequest("w1", prompt, greedy(4)))
    with pytest.raises(QueueFullError):
        bounded.add_request(GenerateRequest("w2", prompt, greedy(4)))
    outputs = run_to_completion(bounded, {})
    assert {rid: outs[-1].finish_reason for rid, outs in outputs.items()} == {"w0": "length", "w1": "length"}
    bounded.add_request(GenerateRequest("w3", prompt, greedy(4)))  # room again once they drained


def test_a_request_whose_sampling_raises_fails_alone(llm):
    prompts = [chat_ids(llm, q) for q in QUESTIONS[:4]]
    expected = _greedy_outputs(llm, prompts, 12)
    # A biased (so not plain-greedy) row; its bias is corrupted after validation, as a validation bug
    # or a corrupted message would, so the batched sampler raises IndexError on it.
    bad = SamplingParams(max_tokens=12, temperature=0.0, logit_bias={5: 1.0})
    requests = [GenerateRequest(f"r{i}", p, greedy(12)) for i, p in enumerate(prompts)]
    requests.append(GenerateRequest("bad", prompts[0], bad))
    for request in requests:
        llm.add_request(request)
    bad.logit_bias = {llm.vocab_size + 1000: 1.0}
    outputs = run_to_completion(llm, {})
    assert outputs["bad"][-1].finish_reason == "error" and "sampling failed" in outputs["bad"][-1].error
    assert {rid: token_ids(outputs[rid]) for rid in expected} == expected
    assert llm.pool.num_free == llm.pool.num_blocks


def test_a_one_token_prefill_chunk_beside_a_finishing_prompt_does_not_fail_the_step():
    # Budget 17: A's 16-token prompt takes 16, B's prefill gets a 1-token chunk that samples nothing.
    # That chunk rides with the decode rows; with no row to keep, indexing used to fail the whole step.
    chunky = LLMEngine(EngineConfig(kv_cache_memory_bytes=20 * BLOCK_BYTES, max_num_batched_tokens=17))
    arrivals = {
        0: [
            GenerateRequest("a", list(range(100, 116)), greedy(4)),
            GenerateRequest("b", list(range(200, 240)), greedy(4)),
        ]
    }
    outputs = run_to_completion(chunky, arrivals)
    assert {rid: outs[-1].finish_reason for rid, outs in outputs.items()} == {"a": "length", "b": "length"}
    assert chunky.pool.num_free == chunky.pool.num_blocks
