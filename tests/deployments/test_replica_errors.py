"""A replica that dies under a request: a retryable 503 (529 under /v1/messages) with no Ray internals."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from ray.exceptions import ActorDiedError

from api.error_handlers import install_error_handlers
from deployments.replica_errors import install_replica_died_handler


def _app() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    install_replica_died_handler(app)

    @app.post("/v1/chat/completions")
    async def chat() -> None:
        raise ActorDiedError()

    @app.post("/v1/messages")
    async def messages() -> None:
        raise ActorDiedError()

    return TestClient(app, raise_server_exceptions=False)


def test_a_dead_replica_is_a_retryable_503_in_openai_shape():
    response = _app().post("/v1/chat/completions")
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    error = response.json()["error"]
    assert error["code"] == "replica_unavailable" and "actor" not in error["message"].lower()


def test_a_dead_replica_is_a_529_under_the_anthropic_routes():
    response = _app().post("/v1/messages")
    assert response.status_code == 529 and "retry-after" in response.headers
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "overloaded_error"
