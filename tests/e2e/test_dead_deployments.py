"""Deployments that cannot start are loud: /health is 503 with the reason, and each request that needs one
fails within seconds with a 503 in its route's dialect, while what does not need it goes on serving.

Two more apps beside the session's, in the same Ray cluster and Serve instance: one whose model does not
exist (its Scheduler and Tokenizer never start; its Embedder does), and one whose embedding model does not
exist (its Scheduler and Tokenizer start, its Embedder never does).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import E2E_ARGS

pytestmark = pytest.mark.e2e

DOWN_DEADLINE_S = 180  # Ray Serve starts each replica, which fails once it has imported the engine
FAIL_FAST_S = 10


def _args(engine: dict, embedder: dict) -> dict:
    args = copy.deepcopy(E2E_ARGS)
    args["engine"] |= engine
    # No CPU reserved: the session's app holds the cluster's cores; these replicas are idle or dead.
    args["scheduler"] |= {"num_replicas": 1, "num_cpus": 0}
    args["embedder"] |= {"num_cpus": 0, **embedder}
    for name in ("tokenizer", "ingress", "response_store"):
        args.setdefault(name, {})["num_cpus"] = 0
    return args


@pytest.fixture(scope="module")
def broken_apps(base_url: str) -> Iterator[dict[str, str]]:
    from ray import serve
    from ray.serve.api import RunTarget

    from deployments.app import build_app

    apps = {
        "no-model": _args({"model": "/nonexistent/llm-model", "served_model_name": "gone"}, {}),
        "no-embedder": _args({}, {"model": "/nonexistent/embedding-model"}),
    }
    targets = [RunTarget(build_app(args), name=name, route_prefix=f"/{name}") for name, args in apps.items()]
    serve.run_many(targets, wait_for_applications_running=False)
    try:
        yield {name: f"{base_url}/{name}" for name in apps}
    finally:
        for name in apps:
            serve.delete(name)


def _wait_down(url: str, deployment: str) -> dict:
    """/health's body once it names `deployment` as down."""
    deadline = time.monotonic() + DOWN_DEADLINE_S
    body: dict = {}
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/health", timeout=15)
        except httpx.HTTPError:
            response = None
        if response is not None and response.headers.get("content-type") == "application/json":
            body = response.json()
            problem = body.get("deployments", {}).get(deployment, {}).get("problem")
            if problem:
                assert response.status_code == 503 and body["status"] == "unhealthy"
                return body
        time.sleep(1)
    raise TimeoutError(f"/health at {url} never named {deployment} as down; last body: {body}")


def _timed_post(url: str, body: dict) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = httpx.post(url, json=body, timeout=60)
    return response, time.monotonic() - start


def test_a_scheduler_that_cannot_load_its_model_fails_chat_fast_and_leaves_embeddings_up(broken_apps):
    url = broken_apps["no-model"]
    health = _wait_down(url, "Scheduler")
    assert "could not load model '/nonexistent/llm-model': no such directory" in health["error"]

    chat = {"model": "gone", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    response, elapsed_s = _timed_post(f"{url}/v1/chat/completions", chat)
    assert response.status_code == 503 and elapsed_s < FAIL_FAST_S, (response.text, elapsed_s)
    error = response.json()["error"]
    assert error["code"] == "deployment_unavailable" and "no such directory" in error["message"]
    assert response.headers["retry-after"]

    messages = {"model": "gone", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    response, elapsed_s = _timed_post(f"{url}/v1/messages", messages)
    assert response.status_code == 529 and elapsed_s < FAIL_FAST_S, (response.text, elapsed_s)
    assert response.json()["error"]["type"] == "overloaded_error"

    # The Embedder has its own model and serves on.
    embedded = httpx.post(f"{url}/v1/embeddings", json={"model": "default", "input": "hi"}, timeout=60)
    assert embedded.status_code == 200 and len(embedded.json()["data"][0]["embedding"]) == 384


def test_an_embedder_that_cannot_load_fails_embeddings_fast_and_leaves_chat_up(broken_apps):
    url = broken_apps["no-embedder"]
    health = _wait_down(url, "Embedder")
    assert "could not load embedding model '/nonexistent/embedding-model'" in health["error"]

    response, elapsed_s = _timed_post(f"{url}/v1/embeddings", {"model": "default", "input": "hi"})
    assert response.status_code == 503 and elapsed_s < FAIL_FAST_S, (response.text, elapsed_s)
    assert response.json()["error"]["code"] == "deployment_unavailable"

    chat = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    answered = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120)
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"]
    # and the model list names the chat model as loaded and the embedding model as failed
    listed = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert [(card["id"], card["state"]) for card in listed] == [
        ("smol-e2e", "loaded"),
        ("embedding-model", "failed"),
    ]
