"""Every failure reaches the client in OpenAI's error shape; FastAPI's {"detail": ...} never does."""

from __future__ import annotations

import json

from engine.errors import (
    ContextLengthExceededError,
    EngineError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
)

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.anthropic_schemas import MessagesRequest
from api.body import UnknownFields, parse_body
from api.error_handlers import install_error_handlers
from api.errors import from_engine_error
from api.openai_schemas import ChatCompletionRequest, EmbeddingRequest
from api.responses_schemas import ResponsesRequest


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    strict, lenient = UnknownFields(strict=True), UnknownFields()

    @app.post("/chat")
    async def chat(request: Request):
        return (await parse_body(request, ChatCompletionRequest, strict)).model_dump(exclude_none=True)

    @app.post("/lenient")
    async def lenient_chat(request: Request):
        body = await parse_body(request, ChatCompletionRequest, lenient)
        return {"model_extra": body.model_extra, "seen": lenient.seen()}

    @app.get("/typed/{n}")
    async def typed(n: int):
        return {"n": n}

    @app.get("/boom")
    async def boom():
        raise RuntimeError("kaput")

    return TestClient(app, raise_server_exceptions=False)


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_valid_body_parses(client):
    response = client.post("/chat", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200 and response.json()["model"] == "m"


def test_malformed_json_is_400(client):
    response = client.post("/chat", content=b"{not json", headers={"content-type": "application/json"})
    error = error_of(response)
    assert response.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] is None and error["code"] == "invalid_json"


def test_unknown_field_is_400_naming_it(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}
    response = client.post("/chat", json=body)
    error = error_of(response)
    assert response.status_code == 400 and error["param"] == "frobnicate" and "frobnicate" in error["message"]


def test_unknown_top_level_field_is_accepted_and_logged_once_when_lenient(client, caplog):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "frobnicate_lenient": 1}
    with caplog.at_level("WARNING", logger="api.body"):
        first, second = client.post("/lenient", json=body), client.post("/lenient", json=body)
    assert first.status_code == second.status_code == 200
    assert second.json()["seen"] == [["/lenient", "frobnicate_lenient"]]
    assert [r.getMessage() for r in caplog.records].count(
        "/lenient: unknown request field 'frobnicate_lenient' accepted and ignored (logged once)"
    ) == 1


def test_unknown_nested_field_is_400_even_when_lenient(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x", "frobnicate": 1}]}
    response = client.post("/lenient", json=body)
    assert response.status_code == 400 and error_of(response)["param"] == "messages[0].frobnicate"


def test_bad_nested_value_names_the_path(client):
    response = client.post("/chat", json={"model": "m", "messages": [{"role": "wizard", "content": "x"}]})
    assert response.status_code == 400 and error_of(response)["param"] == "messages[0].role"


def test_missing_field_is_400(client):
    response = client.post("/chat", json={"messages": [{"role": "user", "content": "x"}]})
    error = error_of(response)
    assert error["param"] == "model" and error["code"] == "missing_required_parameter"


def test_out_of_range_is_400(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}
    assert error_of(client.post("/chat", json=body))["param"] == "temperature"


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", "5"), ("temperature", "0.5"), ("stream", 1), ("seed", 2.0)]
)
def test_a_wrongly_typed_value_is_400_not_coerced(client, field, value):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}
    response = client.post("/chat", json=body)
    assert response.status_code == 400 and error_of(response)["param"] == field


def test_an_integer_is_a_valid_number(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1}
    assert client.post("/chat", json=body).json()["temperature"] == 1


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (MessagesRequest, {"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}),
        (ResponsesRequest, {"model": "m", "input": "x", "max_output_tokens": "5"}),
        (EmbeddingRequest, {"model": "m", "input": "x", "dimensions": "5"}),
    ],
)
def test_every_dialect_refuses_a_number_in_a_string(model, body):
    with pytest.raises(ValidationError, match="valid integer"):
        model.model_validate_json(json.dumps(body))


def test_fastapi_validation_error_is_mapped(client):
    response = client.get("/typed/abc")
    assert response.status_code == 400 and error_of(response)["param"] == "path.n"


def test_unknown_route_and_method_are_openai_shaped(client):
    assert client.get("/nope").status_code == 404 and error_of(client.get("/nope"))["code"] == "not_found"
    response = client.get("/chat")
    assert response.status_code == 405 and error_of(response)["code"] == "method_not_allowed"


def test_unexpected_exception_is_500_openai_shaped(client):
    response = client.get("/boom")
    assert response.status_code == 500 and error_of(response)["type"] == "server_error"


@pytest.mark.parametrize(
    ("exc", "status", "code", "param"),
    [
        (ContextLengthExceededError("too long"), 400, "context_length_exceeded", "messages"),
        (InvalidRequestError("bad top_p", param="top_p"), 400, "invalid_request_error", "top_p"),
        (QueueFullError("full"), 503, "queue_full", None),
        (RequestFailedError("sampler"), 500, "request_failed", None),
        (EngineError("?"), 500, "engine_error", None),
    ],
)
def test_engine_errors_map_to_status_codes(exc, status, code, param):
    error = from_engine_error(exc, prompt_param="messages")
    assert (error.status, error.code, error.param) == (status, code, param)
    assert error.body()["error"]["message"] == exc.message


def test_unknown_field_is_named_before_other_errors(client):
    response = client.post("/chat", json={"model": "m", "messages": [], "frobnicate": 1})
    assert error_of(response)["param"] == "frobnicate"


def test_non_object_body_is_400(client):
    response = client.post("/chat", json=[1, 2])
    assert response.status_code == 400 and "request body" in error_of(response)["message"]


def test_context_overflow_blames_the_routes_prompt_field_or_max_tokens():
    assert from_engine_error(ContextLengthExceededError("x", param="messages"), "prompt").param == "prompt"
    assert (
        from_engine_error(ContextLengthExceededError("x", param="max_tokens"), "prompt").param == "max_tokens"
    )
