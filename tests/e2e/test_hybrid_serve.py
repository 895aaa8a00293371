"""A hybrid recurrent model through `serve run`: a tiny random-weight qwen3_next directory (linear-attention
layers with per-request state slots beside paged attention layers), 16 concurrent streams answering
exactly what each prompt answers alone, and /v1/status saying how its caches are kept.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from bench import serve_proc
from tests.architectures import ARCHITECTURES, SEEDS
from tests.tiny_text_model import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
SERVE_CLI = str(Path(sys.executable).with_name("serve"))
NUM_STREAMS = 16
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("hybrid")
    model = build_tiny_model(folder / "qwen3_next", ARCHITECTURES["qwen3_next"], SEEDS.get("qwen3_next", 0))
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    port = serve_proc.free_port()
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args["engine"].update(model=str(model), served_model_name="tiny-qwen3-next", max_num_seqs=NUM_STREAMS)
    args["engine"]["kv_cache_memory_bytes"] = 64 << 20
    args["embedder"]["enabled"] = False
    config_path = folder / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = os.environ | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_ADDRESS": "local"}
    cmd = [SERVE_CLI, "run", str(config_path)]
    server = serve_proc.start("serve-run-hybrid", cmd, env, REPO, folder / "serve.log", port, signal.SIGINT)
    try:
        try:
            serve_proc.wait_ready(server, 300)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{server.log_tail()}") from None
        yield server.base_url
    finally:
        serve_proc.stop(server)


def _prompt(i: int) -> list[int]:
    """Token ids: the tiny model's vocabulary is the first 512 ids of the bundled tokenizer's."""
    return [20 + (7 * i + 13 * j) % 480 for j in range(20 + 7 * i)]


def _stream(url: str, i: int) -> str:
    body = {
        "model": "default",
        "prompt": _prompt(i),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(text)


def test_sixteen_concurrent_streams_answer_what_each_answers_alone(served: str):
    alone = [_stream(served, i) for i in range(NUM_STREAMS)]
    with concurrent.futures.ThreadPoolExecutor(NUM_STREAMS) as pool:
        together = list(pool.map(lambda i: _stream(served, i), range(NUM_STREAMS)))
    assert together == alone
    assert len(set(alone)) > NUM_STREAMS // 2  # the prompts reach the model: their answers differ
    status = httpx.get(f"{served}/v1/status", timeout=30).json()
    compute = status["replicas"][0]["compute"]
    assert "state x" in compute["cache_layers"] and "kv x" in compute["cache_layers"]
    assert compute["prefix_cache"].startswith("off: the model has recurrent layers")
    assert compute["decode_rows"] == "batched"
    assert compute["num_state_slots"] == NUM_STREAMS and compute["state_bytes_per_seq"] > 0
