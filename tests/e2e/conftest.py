"""Starts the real app once per session: Ray, Serve, the real engine and the bundled model, on a free port.

Two Scheduler replicas, so that /v1/status really aggregates and streams spread over engines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from bench import serve_proc

# Each Scheduler replica gets one BLAS thread: two replicas share this 2-core machine.
E2E_ARGS = {
    "engine": {
        "served_model_name": "smol-e2e",
        "max_num_seqs": 16,
        "max_model_len": 1024,
        "kv_cache_memory_bytes": 64 * 1024 * 1024,
    },
    "stream_interval_s": 0.02,
    "scheduler": {"num_replicas": 2, "num_cpus": 0.5, "num_threads": 1, "max_ongoing_requests": 64},
    "tokenizer": {"num_cpus": 0.2},
    "embedder": {"num_cpus": 0.2},
    "ingress": {"num_cpus": 0.2},
}
STARTUP_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    import ray
    from ray import serve

    from deployments.app import build_app

    port = serve_proc.free_port()
    ray.init(
        num_cpus=os.cpu_count() or 2,
        object_store_memory=128 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(E2E_ARGS), name="e2e", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the app at {url} did not answer /v1/models within {STARTUP_TIMEOUT_S} s")


@pytest.fixture(scope="session")
def client(base_url: str):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as http_client:
        yield http_client
