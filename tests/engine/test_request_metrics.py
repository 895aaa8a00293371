"""Latency histograms and finish counts, recorded by the real engine as it serves requests."""

from engine.messages import GenerateRequest, SamplingParams

from tests.engine.engine_helpers import run_to_completion


def test_one_ttft_per_request_one_gap_per_later_token_and_a_finish_each(llm):
    before = llm.stats()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    requests = [GenerateRequest(f"m{i}", [1, 2, 3, 4 + i], params) for i in range(3)]
    run_to_completion(llm, {0: requests[:2], 2: requests[2:]})
    llm.add_request(GenerateRequest("aborted", [5, 6, 7], params))
    llm.abort_request("aborted")
    llm.step()
    after = llm.stats()

    def grew(name: str) -> int:
        return getattr(after, name).count - getattr(before, name).count

    assert grew("time_to_first_token_s") == 3
    assert grew("inter_token_latency_s") == 3 * 4
    assert grew("e2e_request_latency_s") == 4
    by_reason = after.num_requests_by_finish_reason
    assert by_reason["length"] - before.num_requests_by_finish_reason.get("length", 0) == 3
    assert by_reason["abort"] - before.num_requests_by_finish_reason.get("abort", 0) == 1
    assert 0 < after.time_to_first_token_s.sum and after.uptime_s > 0
