"""Several models behind one `serve run`, on a two-node Ray cluster started on this machine:

- the bundled model and a tiny random-weight hybrid model (qwen3_next, made by the test), each answering
  under its own names, plus the embedder; an unknown name is a 404;
- a model whose path is wrong is a 503 naming it, while the others serve;
- the hybrid model is `on_demand` and pinned to the second node's custom resource: it starts on its
  first request (a stream gets keep-alives meanwhile, and /v1/status shows the wait), runs on that node,
  answers 16 concurrent streams exactly as one at a time, and goes back to zero replicas after its idle
  timeout, as Ray Serve's own status says;
- two Ingress replicas share one Responses store, so `previous_response_id` chains whichever gets it.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import engine  # noqa: F401  # isort: split  (OpenBLAS before MLX, which tests.tiny_text_model imports)

import httpx
import pytest
import yaml

from bench import serve_proc
from tests.architectures import ARCHITECTURES, SEEDS
from tests.tiny_text_model import build_tiny_model

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SERVE_CLI = str(Path(sys.executable).with_name("serve"))
NODE_B = "node_b"  # the second node's custom resource
SMOL, TINY, BROKEN, EMBEDDER = "smol-mm", "tiny-qwen3-next", "broken", "all-MiniLM-L6-v2"
IDLE_TIMEOUT_S = 5
NUM_STREAMS = 16
MAX_TOKENS = 24
STARTUP_TIMEOUT_S = 300


@dataclass
class Served:
    url: str
    ray_address: str
    kv_disk: Path


def _args(tiny: Path, missing: Path, kv_disk: Path) -> dict:
    settings = {"max_num_seqs": NUM_STREAMS, "kv_cache_memory_bytes": 64 << 20}
    # The bundled model keeps int8 K/V, drafts by prompt lookup and writes its prefix blocks to disk.
    smol = settings | {
        "max_model_len": 1024,
        "kv_cache_dtype": "int8",
        "speculative": {"method": "ngram", "num_speculative_tokens": 4},
        "prefix_cache_disk": {"path": str(kv_disk), "max_gb": 0.5},
    }
    scheduler = {"num_cpus": 0.5, "num_threads": 1, "max_ongoing_requests": 64}
    return {
        "models": [
            {"served_model_name": SMOL, "aliases": ["chat"], "engine": smol,
             "deployment": scheduler, "tokenizer": {"num_cpus": 0.1}},
            {"model": str(tiny), "served_model_name": TINY, "engine": settings,
             "deployment": scheduler | {"resources": {NODE_B: 0.5}}, "tokenizer": {"num_cpus": 0.1},
             "on_demand": {"idle_timeout_s": IDLE_TIMEOUT_S}},
            {"model": str(missing), "served_model_name": BROKEN, "deployment": {"num_cpus": 0},
             "tokenizer": {"num_cpus": 0}},
            {"kind": "embedding", "deployment": {"num_cpus": 0.1}},
        ],
        "stream_keepalive_s": 1,
        "ingress": {"num_replicas": 2, "num_cpus": 0.1},
    }  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("multi_model")
    tiny = build_tiny_model(folder / "qwen3_next", ARCHITECTURES["qwen3_next"], SEEDS.get("qwen3_next", 0))
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    port = serve_proc.free_port()
    config["http_options"]["port"] = port
    config["applications"][0]["args"] = _args(tiny, folder / "missing-model-dir", folder / "kv-disk")
    config_path = folder / "multi_model.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"
    }
    cluster = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.two_node_cluster", NODE_B],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        address = _cluster_address(cluster)
        cmd = [SERVE_CLI, "run", str(config_path), "--address", address]
        server = serve_proc.start(
            "serve-run-multi", cmd, env, REPO, folder / "serve.log", port, signal.SIGINT
        )
        try:
            try:
                serve_proc.wait_ready(server, STARTUP_TIMEOUT_S)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\n{server.log_tail()}") from None
            yield Served(server.base_url, address, folder / "kv-disk")
        finally:
            serve_proc.stop(server, grace_s=10.0)  # the cluster goes next: no graceful stop to wait for
    finally:
        cluster.terminate()
        cluster.wait(120)


def _cluster_address(cluster: subprocess.Popen) -> str:
    assert cluster.stdout is not None
    line = cluster.stdout.readline()  # the cluster prints its address once both nodes are up
    if not line.startswith("address "):
        raise RuntimeError(f"the two-node cluster did not start: {line!r} (exit {cluster.poll()})")
    return line.split()[1]


_FACTS = """
import json, sys
import ray
from ray import serve
ray.init(address=sys.argv[1], log_to_driver=False)
app = serve.status().applications["llm"]
deployments = {n: {"status": str(d.status.value), "replicas": {str(k): v for k, v in d.replica_states.items()}}
               for n, d in app.deployments.items()}
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and sys.argv[2] in n["Resources"]]
from ray._private.state import actors as actor_table  # the GCS's table: no dashboard needed
actors = [{"name": a["ActorClassName"], "node_id": a["Address"]["NodeID"]}
          for a in actor_table().values() if a["State"] == "ALIVE"]
print(json.dumps({"deployments": deployments, "node_b": nodes, "actors": actors}))
"""


def _ray_env() -> dict[str, str]:
    """The cluster's nodes and every client of it on 127.0.0.1 alike (a client on another address
    of this machine would wait for a raylet that is not there)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return env | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _cluster_facts(served: Served) -> dict:
    """Ray Serve's own status of the app and where each live actor runs, read from the cluster."""
    out = subprocess.run(
        [sys.executable, "-c", _FACTS, served.ray_address, NODE_B],
        check=True, capture_output=True, text=True, timeout=120, env=_ray_env(),
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _chat(served: Served, model: str, content: str = "What is the capital of France?") -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "temperature": 0,
    }
    return httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=300)


def _states(served: Served) -> dict[str, str]:
    cards = httpx.get(f"{served.url}/v1/models", timeout=60).json()["data"]
    return {card["id"]: card["state"] for card in cards}


def _wait_for_state(served: Served, state: str, timeout_s: float) -> None:
    """Until the tiny model's state is `state` in four answers in a row. Each of the two Ingress replicas
    reads Ray Serve's status once a second, so for up to a second one may still give the old state after
    the other gives the new one."""
    deadline, states = time.monotonic() + timeout_s, list[str]()
    while states[-4:] != [state] * 4 and time.monotonic() < deadline:
        states.append(_states(served)[TINY])
        time.sleep(0.25)
    assert states[-4:] == [state] * 4, states[-12:]


def test_each_model_answers_under_its_names_and_an_unknown_name_is_a_404(served: Served):
    for name in ("default", SMOL, "chat", "SmolLM2-135M-Instruct"):
        reply = _chat(served, name)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == SMOL and "Paris" in reply.json()["choices"][0]["message"]["content"]
    missing = _chat(served, "unknown-model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert TINY in missing.json()["error"]["message"]
    vectors = httpx.post(
        f"{served.url}/v1/embeddings", json={"model": EMBEDDER, "input": ["a", "b"]}, timeout=60
    )
    assert vectors.status_code == 200 and len(vectors.json()["data"]) == 2
    assert vectors.json()["model"] == EMBEDDER


def test_models_lists_every_configured_model_with_its_state_and_source(served: Served):
    cards = {card["id"]: card for card in httpx.get(f"{served.url}/v1/models", timeout=60).json()["data"]}
    assert list(cards) == [SMOL, TINY, BROKEN, EMBEDDER]
    assert cards[SMOL]["state"] == "loaded" and cards[SMOL]["max_model_len"] == 1024
    assert cards[SMOL]["root"] == "bundled:smollm2-135m-instruct"
    assert cards[TINY]["root"].endswith("qwen3_next") and cards[TINY]["state"] in (
        "cold",
        "loading",
        "loaded",
    )
    assert cards[EMBEDDER]["output_modalities"] == ["embedding"]


def test_a_model_that_cannot_load_is_a_503_naming_it_while_the_others_serve(served: Served):
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while (reply := _chat(served, BROKEN)).status_code != 503 and time.monotonic() < deadline:
        time.sleep(2)  # its replicas fail one start after another until Ray Serve reports it
    assert reply.status_code == 503, reply.text
    assert f"the model '{BROKEN}' cannot serve" in reply.json()["error"]["message"]
    assert "no such directory" in reply.json()["error"]["message"]
    assert _states(served)[BROKEN] == "failed"
    assert _chat(served, SMOL).status_code == 200
    health = httpx.get(f"{served.url}/health", timeout=60)
    assert health.status_code == 503 and health.json()["models"][BROKEN] == "failed"
    assert health.json()["models"][SMOL] == "loaded"


def _stream_completion(served: Served, prompt: list[int], lines: list[str] | None = None) -> str:
    body = {"model": TINY, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}  # fmt: skip
    text = []
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if lines is not None:
                lines.append(line)
            if line.startswith("data: ") and line != "data: [DONE]":
                text += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(text)


def _prompt(i: int) -> list[int]:
    """Token ids: the tiny model's vocabulary is the first 512 ids of the bundled tokenizer's."""
    return [20 + (7 * i + 13 * j) % 480 for j in range(20 + 7 * i)]


def test_a_cold_on_demand_model_starts_on_its_first_request_with_keepalives(served: Served):
    assert _states(served)[TINY] == "cold"
    lines: list[str] = []
    started = time.monotonic()
    stream = threading.Thread(target=lambda: _stream_completion(served, _prompt(0), lines))
    stream.start()
    seen_states, seen_waiting = set(), 0
    while stream.is_alive():
        status = httpx.get(f"{served.url}/v1/status", timeout=60).json()["models"][TINY]
        seen_states.add(status["state"])
        seen_waiting = max(seen_waiting, status["cold_start"]["num_waiting"])
        time.sleep(0.3)
    stream.join()
    waited_s = time.monotonic() - started
    assert "loading" in seen_states, seen_states
    assert seen_waiting >= 1  # one of the two Ingress replicas holds the request and counts it
    assert lines.count(": keep-alive") >= 2, f"{waited_s:.1f} s of wait, lines {lines[:5]}"
    assert [line for line in lines if line][-1] == "data: [DONE]"
    _wait_for_state(served, "loaded", 10)


def test_the_pinned_model_runs_on_the_node_with_its_resource(served: Served):
    assert _stream_completion(served, _prompt(1))  # running (started again if it had gone idle)
    facts = _cluster_facts(served)
    (node_b,) = facts["node_b"]
    tiny_nodes = {a["node_id"] for a in facts["actors"] if a["name"].endswith(f"Scheduler-{TINY}")}
    assert tiny_nodes == {node_b}, facts["actors"]


def test_the_hybrid_model_answers_sixteen_concurrent_streams_as_one_at_a_time(served: Served):
    alone = [_stream_completion(served, _prompt(i)) for i in range(NUM_STREAMS)]
    with concurrent.futures.ThreadPoolExecutor(NUM_STREAMS) as pool:
        together = list(pool.map(lambda i: _stream_completion(served, _prompt(i)), range(NUM_STREAMS)))
    assert together == alone
    assert len(set(alone)) > NUM_STREAMS // 2  # the prompts reach the model: their answers differ
    status = httpx.get(f"{served.url}/v1/status", timeout=60).json()["models"][TINY]
    compute = status["replicas"][0]["compute"]
    assert "state x" in compute["cache_layers"] and "kv x" in compute["cache_layers"]
    assert compute["prefix_cache"].startswith("off: the model has recurrent layers")
    assert compute["decode_rows"] == "batched"
    assert compute["num_state_slots"] == NUM_STREAMS and compute["state_bytes_per_seq"] > 0


def test_an_idle_on_demand_model_goes_back_to_zero_replicas(served: Served):
    _wait_for_state(served, "cold", 120)  # idle timeout + the autoscaler's look-back + a replica's stop
    serve_status = _cluster_facts(served)["deployments"][f"Scheduler-{TINY}"]
    assert serve_status["replicas"].get("RUNNING", 0) == 0, serve_status
    assert _chat(served, SMOL).status_code == 200  # the always-on model is untouched


def test_previous_response_id_chains_across_two_ingress_replicas(served: Served):
    first = httpx.post(
        f"{served.url}/v1/responses",
        json={"model": SMOL, "input": "My name is Ann.", "max_output_tokens": 8, "temperature": 0},
        timeout=120,
    )
    base = first.json()["usage"]["input_tokens"] + first.json()["usage"]["output_tokens"]
    answered_by = {first.headers["x-mlx-ray-serve-replica"]}
    for _ in range(16):  # until the other Ingress replica has answered a follow-up too
        follow = httpx.post(
            f"{served.url}/v1/responses",
            json={"model": SMOL, "input": "What is my name?", "previous_response_id": first.json()["id"],
                  "max_output_tokens": 4},
            timeout=120,
        )  # fmt: skip
        assert follow.status_code == 200, follow.text
        assert follow.json()["usage"]["input_tokens"] > base  # the first turn is in the prompt
        answered_by.add(follow.headers["x-mlx-ray-serve-replica"])
        if len(answered_by) == 2:
            break
    assert len(answered_by) == 2, "one Ingress replica answered every follow-up"


EDIT_PROMPT = (
    "Here is some Python code:\n\n```python\ndef load(path):\n    with open(path) as f:\n"
    "        return json.load(f)\n```\n\nRewrite it with load renamed to read. Output the whole code."
)


def test_int8_kv_ngram_drafts_and_the_disk_tier_serve_under_serve_run(served: Served):
    body = {"model": SMOL, "messages": [{"role": "user", "content": EDIT_PROMPT}], "max_tokens": 32,
            "temperature": 0}  # fmt: skip
    whole = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=300)
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["message"]["content"]
    streamed = _stream_chat(served, body)
    assert streamed == text and "def" in text  # drafts change nothing a greedy client sees
    status = httpx.get(f"{served.url}/v1/status", timeout=60).json()["models"][SMOL]
    compute = status["replicas"][0]["compute"]
    assert compute["kv_cache_dtype"] == "int8" and compute["speculative"].startswith("ngram")
    assert compute["kv_bytes_per_token"] < 46080 // 3  # float32 K/V of this model: 46,080 bytes a token
    total = status["total"]
    assert 0 < total["spec_num_accepted_tokens"] <= total["spec_num_draft_tokens"]
    assert total["prefix_cache_disk_writes"] > 0 and any(served.kv_disk.rglob("*"))
    metrics = httpx.get(f"{served.url}/metrics", timeout=60).text
    accepted = re.search(rf'vllm:spec_decode_num_accepted_tokens_total{{model_name="{SMOL}"}} (\d+)', metrics)
    assert accepted is not None and int(accepted.group(1)) > 0


def _stream_chat(served: Served, body: dict) -> str:
    parts = []
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=body | {"stream": True}, timeout=300
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                parts += [c["delta"].get("content") or "" for c in chunk["choices"]]
    return "".join(parts)
