"""/metrics speaks Prometheus' text format under vLLM's names; prometheus_client's own parser reads it."""

from __future__ import annotations

from engine.messages import EngineStats
from engine.request_metrics import ITL_BOUNDS_S, TTFT_BOUNDS_S, new_histogram, observe

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import render_metrics
from api.status import total_stats


def replica(ttft: list[float], running: int) -> EngineStats:
    histogram = new_histogram(TTFT_BOUNDS_S)
    for value in ttft:
        observe(histogram, value)
    return EngineStats(
        num_running=running,
        num_blocks_total=100,
        num_blocks_used=25,
        prompt_tokens_total=40,
        generation_tokens_total=8,
        prefix_cache_queries=32,
        prefix_cache_hits=16,
        time_to_first_token_s=histogram,
        inter_token_latency_s=new_histogram(ITL_BOUNDS_S),
        num_requests_by_finish_reason={"length": 1, "error": 1},
    )


def parsed(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_every_vllm_name_is_there_with_the_model_label():
    families = parsed(render_metrics([('smol "x"', EngineStats())]))
    expected = {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:request_success",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    }
    assert expected <= families.keys()
    for samples in families.values():
        assert all(s.labels["model_name"] == 'smol "x"' for s in samples)


def test_values_of_two_replicas_add_up():
    total = total_stats([replica([0.003, 0.3], running=2), replica([0.003], running=1)])
    families = parsed(render_metrics([("smol", total)]))
    value = {name: samples[0].value for name, samples in families.items()}
    assert value["vllm:num_requests_running"] == 3
    assert value["vllm:kv_cache_usage_perc"] == 0.25
    assert value["vllm:prompt_tokens"] == 80 and value["vllm:prefix_cache_hits"] == 32
    success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"]}
    assert success == {"stop": 0, "length": 2, "abort": 0, "error": 2}


def test_speculative_decoding_counters_add_up_per_draft_position():
    first = EngineStats(spec_num_drafts=3, spec_num_draft_tokens=12, spec_num_accepted_tokens=5)
    first.spec_accepted_per_pos = [3, 2, 0, 0]
    second = EngineStats(spec_num_drafts=1, spec_num_draft_tokens=4, spec_num_accepted_tokens=4)
    second.spec_accepted_per_pos = [1, 1, 1, 1]
    families = parsed(render_metrics([("smol", total_stats([first, second]))]))
    assert families["vllm:spec_decode_num_drafts"][0].value == 4
    assert families["vllm:spec_decode_num_draft_tokens"][0].value == 16
    assert families["vllm:spec_decode_num_accepted_tokens"][0].value == 9
    per_pos = {
        s.labels["position"]: s.value for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"]
    }
    assert per_pos == {"0": 4, "1": 3, "2": 1, "3": 1}
    plain = parsed(render_metrics([("smol", EngineStats())]))
    assert "vllm:spec_decode_num_accepted_tokens_per_pos" not in plain  # no model speculates


def test_histogram_buckets_are_cumulative():
    total = total_stats([replica([0.003, 0.3], running=0), replica([0.003, 5000.0], running=0)])
    samples = parsed(render_metrics([("smol", total)]))["vllm:time_to_first_token_seconds"]
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    assert buckets["0.001"] == 0 and buckets["0.005"] == 2 and buckets["0.5"] == 3
    assert buckets["2560.0"] == 3 and buckets["+Inf"] == 4
    count = next(s.value for s in samples if s.name.endswith("_count"))
    total_sum = next(s.value for s in samples if s.name.endswith("_sum"))
    assert count == 4 and abs(total_sum - 5000.306) < 1e-9


def test_a_bound_value_falls_in_its_own_bucket():
    histogram = new_histogram([0.1, 1.0])
    observe(histogram, 0.1)
    observe(histogram, 2.0)
    assert histogram.counts == [1, 0, 1]


def test_several_models_share_one_header_per_metric_and_differ_by_model_name():
    busy = EngineStats(num_running=3, prompt_tokens_total=10)
    text = render_metrics([("chat", busy), ("coder", EngineStats())])
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1
    families = parsed(text)  # prometheus_client's parser refuses a family split in two
    running = {s.labels["model_name"]: s.value for s in families["vllm:num_requests_running"]}
    assert running == {"chat": 3, "coder": 0}


def test_the_disk_tier_counters_add_up_under_our_own_names():
    replicas = [EngineStats(prefix_cache_disk_hits=64, prefix_cache_disk_writes_dropped=1)] * 2
    families = parsed(render_metrics([("smol", total_stats(replicas))]))
    assert families["mlx_ray_serve:prefix_cache_disk_hits"][0].value == 128
    assert families["mlx_ray_serve:prefix_cache_disk_writes_dropped"][0].value == 2
