"""The guard chain on a small FastAPI app: every refusal in the route's dialect, with the right status."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from starlette.responses import StreamingResponse

from api.body import UnknownFields, parse_body
from api.config import LimitsConfig, RateLimitConfig, SecurityConfig
from api.error_handlers import install_error_handlers
from api.guard import GuardMiddleware
from api.openai_schemas import EmbeddingRequest

KEY = "sk-test"
SECURITY = SecurityConfig(api_keys=[KEY, "sk-other"], cors_allow_origins=["https://ui.example"])
LIMITS = LimitsConfig(
    max_body_bytes=2048, request_timeout_s=0.5, rate_limit=RateLimitConfig(requests_per_minute=60, burst=3)
)
cancelled: list[str] = []


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(GuardMiddleware, configs=lambda: (SECURITY, LIMITS))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return "vllm:num_requests_running 0"

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return (await parse_body(request, EmbeddingRequest, UnknownFields())).model_dump(exclude_none=True)

    @app.post("/v1/messages")
    async def messages(request: Request):
        await request.body()
        return {"type": "message"}

    @app.get("/slow")
    async def slow():
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.append("slow")

    @app.get("/slow-stream")
    async def slow_stream():
        async def frames():
            yield 'data: {"n":1}\n\n'
            await asyncio.sleep(30)

        return StreamingResponse(frames(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(make_app(), raise_server_exceptions=False)


def bearer(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_missing_or_wrong_key_is_401_in_each_dialect(client):
    response = client.post("/v1/embeddings", json={"model": "m", "input": "x"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"
    response = client.post("/v1/embeddings", json={"model": "m", "input": "x"}, headers=bearer("sk-nope"))
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    response = client.post("/v1/messages", json={}, headers={"x-api-key": "sk-nope"})
    assert response.status_code == 401
    assert response.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }


def test_bearer_and_x_api_key_pass_and_probes_stay_open(client):
    body = {"model": "m", "input": "x"}
    assert client.post("/v1/embeddings", json=body, headers=bearer("sk-other")).status_code == 200
    assert client.post("/v1/messages", json={}, headers={"x-api-key": "sk-other"}).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200


def test_a_body_over_the_limit_is_413_declared_or_streamed(client):
    big = b'{"model": "m", "input": "' + b"x" * 4096 + b'"}'
    response = client.post("/v1/embeddings", content=big, headers=bearer())
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    chunked = client.post("/v1/messages", content=iter([big[:1500], big[1500:]]), headers={"x-api-key": KEY})
    assert chunked.status_code == 413 and chunked.json()["error"]["type"] == "request_too_large"


def test_the_rate_limit_is_429_with_retry_after_per_key():
    client = TestClient(make_app(), raise_server_exceptions=False)
    statuses = [client.get("/health").status_code for _ in range(5)]  # open paths are not counted
    headers = bearer("sk-other")
    statuses += [client.get("/nope", headers=headers).status_code for _ in range(4)]
    assert statuses == [200] * 5 + [404, 404, 404, 429]
    refused = client.get("/nope", headers=headers)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert client.get("/nope", headers=bearer()).status_code == 404  # another key, another bucket


def test_a_slow_route_is_408_and_cancelled(client):
    response = client.get("/slow", headers=bearer())
    assert response.status_code == 408 and response.json()["error"]["code"] == "request_timeout"
    assert cancelled == ["slow"]


def test_a_started_stream_ends_with_an_error_event(client):
    response = client.get("/slow-stream", headers=bearer())
    assert response.status_code == 200
    frames = response.text.split("\n\n")
    assert frames[0] == 'data: {"n":1}' and '"code":"request_timeout"' in frames[1]
    assert frames[2] == "data: [DONE]"


def test_cors_preflight_is_answered_for_allowed_origins(client):
    headers = {
        "origin": "https://ui.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    response = client.options("/v1/embeddings", headers=headers)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://ui.example"
    refused = client.get("/nope", headers={"origin": "https://ui.example"})
    assert (
        refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "https://ui.example"
    )


def test_unknown_anthropic_route_is_anthropic_shaped(client):
    response = client.get("/v1/messages/nope", headers=bearer())
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
