"""The operator surface of the real app: /metrics under vLLM's names, /v1/status, error shapes, OpenAPI."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
VLLM_NAMES = [
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
]


def chat(http: httpx.Client, max_tokens: int = 4) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    response = http.post("/v1/chat/completions", json={**body, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


def metrics(http: httpx.Client) -> dict[str, dict[tuple, float]]:
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return families


def value(families: dict, name: str, sample: str | None = None, **labels: str) -> float:
    wanted = {"model_name": MODEL, **labels}
    return next(
        v
        for (sample_name, sample_labels), v in families[name].items()
        if sample_name == (sample or name) and wanted.items() <= dict(sample_labels).items()
    )


def wait_idle(http: httpx.Client) -> None:
    """Until no request of an earlier test is still running, so that counters move for ours alone."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        total = http.get("/v1/status").json()["total"]
        if total["num_running"] == 0 and total["num_waiting"] == 0:
            return
        time.sleep(0.2)
    raise TimeoutError("the engines did not go idle")


def test_metrics_carry_every_vllm_name_with_sane_values(http):
    wait_idle(http)
    before = metrics(http)
    usage = chat(http, max_tokens=4)["usage"]
    after = metrics(http)
    assert set(VLLM_NAMES) <= after.keys()

    def grew(name: str, sample: str | None = None, **labels: str) -> float:
        return value(after, name, sample, **labels) - value(before, name, sample, **labels)

    assert grew("vllm:prompt_tokens", "vllm:prompt_tokens_total") == usage["prompt_tokens"]
    assert grew("vllm:generation_tokens", "vllm:generation_tokens_total") == 4
    assert grew("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") >= 0
    reason = "length"
    assert grew("vllm:request_success", "vllm:request_success_total", finished_reason=reason) == 1
    ttft = "vllm:time_to_first_token_seconds"
    assert grew(ttft, ttft + "_count") == 1 and 0 < grew(ttft, ttft + "_sum") < 60
    itl = "vllm:inter_token_latency_seconds"
    assert grew(itl, itl + "_count") == 3
    e2e = "vllm:e2e_request_latency_seconds"
    assert grew(e2e, e2e + "_count") == 1 and value(after, e2e, e2e + "_bucket", le="+Inf") >= 1
    assert 0 <= value(after, "vllm:kv_cache_usage_perc") <= 1
    assert value(after, "vllm:num_requests_running") >= 0


def test_status_reports_engine_state_and_one_row_per_live_request(http):
    chat(http)
    body = {
        "model": MODEL,
        "prompt": "Once upon a time,",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    with http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        for _ in range(4):
            next(lines)
        status = http.get("/v1/status").json()
    total = status["total"]
    assert status["num_replicas"] == 2 and status["errors"] == []
    assert total["uptime_s"] > 0 and total["num_steps"] > 0
    assert total["prompt_tokens_total"] > 0 and total["generation_tokens_total"] > 0
    assert total["num_blocks_used"] > 0 and 0 < total["kv_cache_usage"] <= 1
    assert total["num_blocks_free"] + total["num_blocks_used"] == total["num_blocks_total"]
    assert total["prefix_cache_hit_rate"] is None or 0 <= total["prefix_cache_hit_rate"] <= 1
    assert total["device_memory_bytes"] >= 0
    assert total["latency"]["time_to_first_token_s"]["count"] >= 1
    (row,) = [r for r in total["live_requests"] if r["phase"] == "decode"]
    assert row["num_prompt_tokens"] > 0 and row["num_output_tokens"] >= 2
    assert row["ttft_s"] > 0 and row["tokens_per_s"] > 0 and row["num_cached_tokens"] >= 0


def test_concurrent_streams_travel_gathered_on_one_output_channel_per_replica(http):
    """After the first request a replica takes, this Ingress's streams get their outputs over one
    output channel per Scheduler replica (deployments/inbox.py): each stream still gets exactly its
    own tokens, the ones the same prompt gets unstreamed."""
    prompts = [f"Write one sentence about the number {i}." for i in range(8)]

    def completion(prompt: str, stream: bool) -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24}
        body |= {"temperature": 0, "ignore_eos": True, "stream": stream}
        if not stream:
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["message"]["content"]
        with (
            httpx.Client(base_url=str(http.base_url), timeout=120) as own,  # one connection per stream
            own.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    for _ in range(2):  # a first request on each replica opens this Ingress's channel there
        with ThreadPoolExecutor(len(prompts)) as pool:
            streamed = list(pool.map(lambda p: completion(p, stream=True), prompts))
    assert streamed == [completion(p, stream=False) for p in prompts]

    # While streams run, each replica holding some has this Ingress's channel open (an idle one
    # closes after 2 s); the clients then leave mid-stream, which aborts their requests.
    started, leave = threading.Barrier(len(prompts) + 1), threading.Event()

    def hold(prompt: str) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 400}
        with (
            httpx.Client(base_url=str(http.base_url), timeout=120) as own,
            own.stream(
                "POST", "/v1/chat/completions", json=body | {"ignore_eos": True, "stream": True}
            ) as response,
        ):
            assert response.status_code == 200, response.read()
            lines = response.iter_lines()  # kept: httpx closes the connection when it is dropped
            try:
                for line in lines:
                    chunk = json.loads(line[6:]) if line.startswith("data: {") else {}
                    assert "error" not in chunk, chunk
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        break  # decoding
                else:
                    raise AssertionError("the stream ended before any content")
            except BaseException:
                started.abort()  # the main thread stops waiting and reads this failure
                raise
            started.wait(60)
            leave.wait(60)

    with ThreadPoolExecutor(len(prompts)) as pool:
        held = [pool.submit(hold, p) for p in prompts]
        try:
            started.wait(60)
        except threading.BrokenBarrierError:
            leave.set()
            for future in held:
                future.result()  # raises a stream's own failure
            raise
        deadline_s = time.monotonic() + 10  # the stats a replica answers with lag its event loop
        while not (busy := _busy(status := http.get("/v1/status").json())) and time.monotonic() < deadline_s:
            time.sleep(0.2)
        leave.set()
        for future in held:
            future.result()
    seen = [(r["num_running"], r["num_waiting"], r["output_channels"]) for r in status["replicas"]]
    assert busy, (seen, status["errors"])
    assert all(r["output_channels"] == 1 for r in busy), seen  # one Ingress replica: one channel
    wait_idle(http)


def _busy(status: dict) -> list[dict]:
    return [r for r in status["replicas"] if r["num_running"] + r["num_waiting"] > 0]


def test_status_shows_every_replica_on_the_fast_cpu_paths(http):
    """A served engine that fell back to reference BLAS or MLX's decode ops still answers, only
    slower: this is where an operator (and this test) sees it."""
    for replica in http.get("/v1/status").json()["replicas"]:
        compute = replica["compute"]
        assert (compute["device"], compute["dtype"], compute["blas"]) == ("cpu", "float32", "openblas")
        assert "DYNAMIC_ARCH" in compute["blas_config"] and compute["blas_core"]
        assert compute["decode"] == "c_forward" and compute["prefill"] == "c_forward"


@pytest.mark.parametrize(
    ("method", "path", "status", "shape"),
    [
        ("GET", "/v1/nope", 404, "openai"),
        ("GET", "/v1/chat/completions", 405, "openai"),
        ("POST", "/v1/messages/nope", 404, "anthropic"),
    ],
)
def test_unknown_routes_and_methods_answer_in_the_dialect(http, method, path, status, shape):
    response = http.request(method, path)
    assert response.status_code == status
    body = response.json()
    if shape == "openai":
        assert set(body) == {"error"} and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"


def test_malformed_json_is_400_invalid_json(http):
    response = http.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_context_overflow_names_the_limit(http):
    body = {"model": MODEL, "prompt": [1] * 2000, "max_tokens": 1}
    error = http.post("/v1/completions", json=body).json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("This model's maximum context length is 1024 tokens")


def test_openapi_describes_every_route_and_its_body(http):
    document = http.get("/openapi.json").json()
    paths = document["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages"):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema["$ref"].split("/")[-1] in document["components"]["schemas"]
    assert {"/health", "/metrics", "/v1/status", "/v1/models"} <= paths.keys()
