"""Parallel sampling (`n` > 1) on the real bundled model: one request, n samples sharing the prompt's KV."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.core.parallel_sampling import MAX_N
from engine.errors import InvalidRequestError, QueueFullError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, RequestOutput, SamplingParams

import pytest

from tests.engine.engine_helpers import chat_ids, greedy, run_to_completion, token_ids


@pytest.fixture(params=["sync", "async"])
def any_llm(request) -> LLMEngine:
    return request.getfixturevalue("llm" if request.param == "sync" else "async_llm")


def by_index(outputs: list[RequestOutput]) -> dict[int, list[RequestOutput]]:
    samples: dict[int, list[RequestOutput]] = {}
    for out in outputs:
        samples.setdefault(out.index, []).append(out)
    return samples


def seeded(max_tokens: int, seed: int | None = 7) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)


def fresh_prompt(offset: int, length: int) -> list[int]:
    """Token ids no other test sends, so the prefix cache holds none of their blocks."""
    return [1] + [1000 + offset * 97 + i for i in range(length - 1)]


def test_greedy_samples_are_identical_and_equal_n_1(any_llm):
    llm = any_llm
    prompt = chat_ids(llm, "Name three colours of the rainbow.")
    single = run_to_completion(llm, {0: [GenerateRequest("one", prompt, greedy(16))]})["one"]
    outputs = run_to_completion(llm, {0: [GenerateRequest("three", prompt, greedy(16), n=3)]})["three"]
    samples = by_index(outputs)
    assert sorted(samples) == [0, 1, 2]
    for sample in samples.values():
        assert token_ids(sample) == token_ids(single)
        assert "".join(o.new_text for o in sample) == "".join(o.new_text for o in single)
        assert sample[-1].finish_reason == single[-1].finish_reason
        assert [o.finished for o in sample].count(True) == 1
    assert llm.pool.num_free == llm.pool.num_blocks and not llm.has_unfinished_requests()


def test_seeded_samples_differ_and_the_same_arrivals_reproduce_them(any_llm):
    """Each sample draws with its own seed, and the same arrivals give the same draws. A row's draw
    depends only on its seed and its logits (test_sampler.py checks that for any batch), but its
    logits may differ in the last bits between batch sizes or between a cached and a recomputed
    prefix, since matmuls over other row counts round differently (as in vLLM): at temperature 1 that
    may tip a draw. So the runs compared here meet the same batches and the same cached prefix."""
    llm = any_llm
    prompt = chat_ids(llm, "Write a list of random words.")

    def arrivals() -> dict[int, list[GenerateRequest]]:
        others = [
            GenerateRequest(f"o{i}", chat_ids(llm, f"Count to {i + 3}."), seeded(10, 100 + i))
            for i in range(3)
        ]
        return {0: others[:2], 1: [GenerateRequest("s", prompt, seeded(12), n=3)], 2: others[2:]}

    run_to_completion(llm, arrivals())  # fills the prefix cache, as the runs below find it
    first, second = (run_to_completion(llm, arrivals()) for _ in range(2))
    samples = {i: token_ids(outs) for i, outs in by_index(first["s"]).items()}
    assert len({tuple(t) for t in samples.values()}) == 3, "each sample draws with its own seed"
    assert {i: token_ids(outs) for i, outs in by_index(second["s"]).items()} == samples
    assert {rid: token_ids(outs) for rid, outs in second.items()} == {
        rid: token_ids(outs) for rid, outs in first.items()
    }


def test_samples_share_the_prompts_full_blocks(any_llm):
    llm = any_llm
    block_size = llm.kv.block_size
    prompt = fresh_prompt(1 if llm.async_scheduling else 2, 4 * block_size + 2)  # 4 full blocks + a tail
    hits_before = llm.stats().prefix_cache_hits
    llm.add_request(GenerateRequest("shared", prompt, greedy(8), n=3))
    for _ in range(10):
        llm.step()
        stats = llm.stats()
        if stats.num_running == 3 and all(r.phase == "decode" for r in stats.live_requests):
            break
    else:
        pytest.fail("the three samples never all ran")
    # Each sample's tail (2 prompt tokens + up to 8 outputs) fits in its own one block.
    assert stats.num_blocks_used == 4 + 3, "the prompt's full blocks are held once, not three times"
    assert stats.prefix_cache_hits - hits_before == 2 * 4 * block_size, "samples 1 and 2 hit every full block"
    outputs = run_to_completion(llm, {})["shared"]
    assert sorted(o.index for o in outputs if o.finished) == [0, 1, 2]
    assert llm.pool.num_free == llm.pool.num_blocks


def test_abort_of_the_request_aborts_every_sample_and_frees_all_blocks(any_llm):
    llm = any_llm
    prompt = chat_ids(llm, "Explain what a compiler does.")
    llm.add_request(GenerateRequest("gone", prompt, greedy(200), n=3))
    for _ in range(4):
        llm.step()
    assert llm.stats().num_running == 3 and llm.pool.num_used > 0
    llm.abort_request("gone")
    outputs = [o for o in llm.step() if o.request_id == "gone"]
    assert sorted((o.index, o.finish_reason) for o in outputs) == [(i, "abort") for i in range(3)]
    assert llm.pool.num_used == 0 and not llm.has_unfinished_requests()


def test_abort_while_samples_are_held_back_still_finishes_each_sample(llm):
    # 300 prompt tokens take three 128-token prefill steps: samples 1, 2 wait for sample 0's prefill.
    prompt = fresh_prompt(3, 300)
    llm.add_request(GenerateRequest("early", prompt, greedy(4), n=3))
    llm.step()
    assert llm.stats().num_running == 1 and llm.has_unfinished_requests()
    llm.abort_request("early")
    outputs = run_to_completion(llm, {})["early"]
    assert sorted((o.index, o.finish_reason) for o in outputs) == [(i, "abort") for i in range(3)]
    assert llm.pool.num_used == 0 and not llm.has_unfinished_requests()


def test_one_token_samples_all_finish(any_llm):
    llm = any_llm
    prompt = chat_ids(llm, "Say yes.")
    outputs = run_to_completion(llm, {0: [GenerateRequest("short", prompt, greedy(1), n=4)]})["short"]
    assert sorted(o.index for o in outputs if o.finished) == [0, 1, 2, 3]
    assert all(len(token_ids(sample)) == 1 for sample in by_index(outputs).values())
    assert not llm.has_unfinished_requests() and llm.pool.num_used == 0


def test_each_sample_carries_its_own_logprobs(llm):
    prompt = chat_ids(llm, "Pick a number.")
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, logprobs=2)
    outputs = run_to_completion(llm, {0: [GenerateRequest("lp", prompt, params, n=2)]})["lp"]
    for sample in by_index(outputs).values():
        entries = [e for o in sample for e in o.logprobs or []]
        assert [e.token_id for e in entries] == token_ids(sample)
        assert all(len(e.top) == 2 and e.logprob <= 0 for e in entries)


@pytest.mark.parametrize("n", [0, MAX_N + 1])
def test_n_out_of_range_is_refused_naming_n(llm, n):
    with pytest.raises(InvalidRequestError) as err:
        llm.add_request(GenerateRequest("bad", [1, 2, 3], greedy(2), n=n))
    assert err.value.param == "n"
    assert not llm.has_unfinished_requests()


def test_a_request_id_with_the_sample_separator_is_refused(llm):
    with pytest.raises(InvalidRequestError):
        llm.add_request(GenerateRequest("a#1", [1, 2, 3], greedy(2)))


def test_the_waiting_queue_bound_counts_every_sample():
    bounded = LLMEngine(EngineConfig(kv_cache_memory_bytes=32 << 20, max_num_seqs=4, max_waiting_requests=2))
    with pytest.raises(QueueFullError):
        bounded.add_request(GenerateRequest("three", [1, 2, 3], greedy(2), n=3))
    bounded.add_request(GenerateRequest("two", [1, 2, 3], greedy(2), n=2))
    outputs = run_to_completion(bounded, {})["two"]
    assert sorted(o.index for o in outputs if o.finished) == [0, 1]
