"""API keys, limits and CORS on a second, guarded app in the same Ray Serve instance (route /guarded).

A real engine behind it with room for one running and one waiting request, so a third is refused and
the waiting one's stream gets keep-alive comments. Each test uses its own API key, so the per-key
rate limit of one test does not reach the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-guarded"
PREFIX = "/guarded"
KEYS = {name: f"sk-{name}" for name in ("auth", "rate", "queue", "timeout", "keepalive")}
TIMEOUT_S = 10  # room for the queue test on a loaded 2-core machine; the timeout test waits this twice
GUARDED_ARGS = {
    "engine": {
        "served_model_name": MODEL,
        "max_num_seqs": 1,
        "max_waiting_requests": 1,
        "max_model_len": 2048,
        "kv_cache_memory_bytes": 128 * 1024 * 1024,
    },
    "stream_keepalive_s": 1,
    "scheduler": {"num_replicas": 1, "num_cpus": 0.1, "num_threads": 1, "max_ongoing_requests": 8},
    "tokenizer": {"num_cpus": 0.05},
    "embedder": {"enabled": False},
    "ingress": {"num_cpus": 0.05},
    "response_store": {"num_cpus": 0},
    "security": {"api_keys": list(KEYS.values()), "cors_allow_origins": ["https://ui.example"]},
    "limits": {
        "max_body_bytes": 4096,
        "request_timeout_s": TIMEOUT_S,
        "rate_limit": {"requests_per_minute": 6, "burst": 60},
    },
}


@pytest.fixture(scope="module")
def guarded(base_url: str) -> Iterator[httpx.Client]:
    from ray import serve

    from deployments.app import build_app

    serve.run(build_app(GUARDED_ARGS), name="guarded", route_prefix=PREFIX)
    try:
        with httpx.Client(base_url=base_url + PREFIX, timeout=120) as client:
            yield client
    finally:
        serve.delete("guarded")


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def chat_body(max_tokens: int = 2, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": max_tokens,
        **extra,
    }


def test_requests_without_or_with_a_wrong_key_are_401(guarded):
    missing = guarded.post("/v1/chat/completions", json=chat_body())
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = guarded.get("/v1/models", headers={"authorization": "Bearer sk-wrong"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    anthropic = guarded.post("/v1/messages", json={}, headers={"x-api-key": "sk-wrong"})
    assert anthropic.status_code == 401
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "authentication_error"


# Every route of the app (tests/e2e/test_fuzz.py's OPERATIONS, plus the schema itself) but the probes.
PROTECTED = [
    ("GET", "/v1/models"),
    ("GET", "/v1/status"),
    ("GET", "/openapi.json"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/no-such-route"),  # unknown paths too: nothing is learnt about the app without a key
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-wrong"}, {"authorization": "Basic sk-auth"}],
)
def test_every_route_but_the_probes_refuses_a_missing_or_wrong_key(guarded, method, path, headers):
    response = guarded.request(method, path, headers=headers, json={} if method == "POST" else None)
    assert response.status_code == 401, (response.status_code, response.text[:200])
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    else:
        assert body["error"]["code"] in ("missing_api_key", "invalid_api_key")


def test_a_key_of_another_length_or_case_is_refused(guarded):
    for wrong in (KEYS["auth"] + "x", KEYS["auth"][:-1], KEYS["auth"].upper(), "sk-" + "a" * 4096):
        response = guarded.get("/v1/models", headers={"x-api-key": wrong})
        assert response.status_code == 401, wrong


def test_bearer_and_x_api_key_are_accepted_and_probes_stay_open(guarded):
    assert guarded.post("/v1/chat/completions", json=chat_body(), headers=key("auth")).status_code == 200
    assert guarded.get("/v1/models", headers={"x-api-key": KEYS["auth"]}).status_code == 200
    assert guarded.get("/health").status_code == 200
    scrape = guarded.get("/metrics")
    assert scrape.status_code == 200 and f'model_name="{MODEL}"' in scrape.text


def test_a_body_over_the_limit_is_413(guarded):
    body = chat_body(stop=["x" * 5000])
    response = guarded.post("/v1/chat/completions", json=body, headers=key("auth"))
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_past_the_burst_a_client_gets_429_with_retry_after(guarded):
    statuses = [guarded.get("/v1/models", headers=key("rate")).status_code for _ in range(60)]
    refused = guarded.get("/v1/models", headers=key("rate"))
    assert statuses == [200] * 60 and refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    assert guarded.get("/v1/models", headers=key("auth")).status_code == 200  # other keys go on


def test_cors_preflight_is_answered_for_the_configured_origin(guarded):
    headers = {
        "origin": "https://ui.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    response = guarded.options("/v1/chat/completions", headers=headers)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://ui.example"
    assert "POST" in response.headers["access-control-allow-methods"]


def wait_for(guarded: httpx.Client, name: str, condition) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        response = guarded.get("/v1/status", headers=key(name))
        assert response.status_code == 200, response.text
        total = response.json()["total"]
        if condition(total):
            return total
        time.sleep(0.25)
    raise TimeoutError(f"status never met the condition; last: {total}")


def test_a_full_queue_is_503_with_retry_after_and_529_on_anthropic_routes(guarded):
    # A client per concurrent request; `lines` stays referenced: a collected iter_lines() closes the stream.
    url, headers = str(guarded.base_url), key("queue")
    long = chat_body(max_tokens=900, ignore_eos=True, stream=True)
    with httpx.Client(base_url=url, timeout=120) as first, httpx.Client(base_url=url, timeout=120) as second:
        with first.stream("POST", "/v1/chat/completions", json=long, headers=headers) as running:
            lines = running.iter_lines()
            next(lines)
            waiting = threading.Thread(
                target=second.post,
                args=("/v1/chat/completions",),
                kwargs={"json": chat_body(), "headers": headers},
            )
            waiting.start()
            wait_for(guarded, "queue", lambda total: total["num_waiting"] == 1)
            refused = guarded.post("/v1/chat/completions", json=chat_body(), headers=headers)
            anthropic = guarded.post(
                "/v1/messages",
                json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
                headers={"x-api-key": KEYS["queue"]},
            )
        waiting.join(timeout=60)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "queue_full"
    assert anthropic.status_code == 529, anthropic.text
    assert anthropic.json()["error"]["type"] == "overloaded_error" and "retry-after" in anthropic.headers


class _Tee(httpx.HTTPTransport):
    """A real transport that keeps a copy of every response body's bytes, as they arrive."""

    def __init__(self):
        super().__init__()
        self.received = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        inner, received = response.stream, self.received

        class Copy(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in inner:
                    received.extend(chunk)
                    yield chunk

            def close(self):
                inner.close()

        return httpx.Response(
            response.status_code, headers=response.headers, stream=Copy(), extensions=response.extensions
        )


def test_a_waiting_stream_gets_keepalive_comments_that_the_openai_sdk_skips(guarded):
    import openai

    url, headers, tee = str(guarded.base_url).rstrip("/"), key("keepalive"), _Tee()
    sdk = openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=KEYS["keepalive"],
        max_retries=0,
        http_client=httpx.Client(transport=tee),
    )
    chunks: list = []

    def waiting_stream() -> None:
        stream = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=3, stream=True)  # fmt: skip
        chunks.extend(stream)

    long = chat_body(max_tokens=900, ignore_eos=True, stream=True)
    first = httpx.Client(base_url=url, timeout=120)
    with first, first.stream("POST", "/v1/chat/completions", json=long, headers=headers) as running:
        lines = running.iter_lines()  # kept referenced: a collected iter_lines() closes the stream
        next(lines)
        waiting = threading.Thread(target=waiting_stream)
        waiting.start()
        wait_for(guarded, "keepalive", lambda total: total["num_waiting"] == 1)
        time.sleep(3)  # ~3 heartbeats at stream_keepalive_s = 1; the request timeout is 10 s
    # Leaving the running stream frees the one slot: the waiting request runs.
    waiting.join(timeout=60)
    wire = tee.received.decode()
    before_first_data = wire[: wire.index("data:")]
    assert before_first_data.count(": keep-alive\n\n") >= 2, wire[:300]
    assert chunks and chunks[-1].choices[0].finish_reason == "length"  # the SDK read the stream whole
    assert wire.endswith("data: [DONE]\n\n")


def test_past_the_timeout_a_request_is_408_or_an_error_event_and_aborted(guarded):
    long = chat_body(max_tokens=1900, ignore_eos=True)  # decoding this takes well over TIMEOUT_S on a CPU
    started = time.monotonic()
    response = guarded.post("/v1/chat/completions", json=long, headers=key("timeout"))
    assert response.status_code == 408 and response.json()["error"]["code"] == "request_timeout"
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 5
    total = wait_for(guarded, "timeout", lambda total: total["num_running"] == 0)
    assert total["num_blocks_used"] == 0
    with guarded.stream(
        "POST", "/v1/chat/completions", json={**long, "stream": True}, headers=key("timeout")
    ) as s:
        frames = [line for line in s.iter_lines() if line]
    assert '"code":"request_timeout"' in frames[-2] and frames[-1] == "data: [DONE]"
    wait_for(guarded, "timeout", lambda total: total["num_running"] == 0 and total["num_blocks_used"] == 0)
