"""A stream to a model that is still starting: headers at once, keep-alives while the response is made,
then its frames, or its error as one frame in the route's dialect."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.responses import StreamingResponse

from api.deferred_stream import DeferredEventStream
from api.errors import ApiError

KEEPALIVE_S = 0.02


def _client(make) -> TestClient:
    app = FastAPI()

    async def route():
        return DeferredEventStream(make, KEEPALIVE_S)

    app.add_api_route("/v1/chat/completions", route, methods=["POST"])
    app.add_api_route("/v1/messages", route, methods=["POST"])
    return TestClient(app)


def test_keepalives_flow_until_the_made_stream_sends_its_frames():
    async def make():
        await asyncio.sleep(10 * KEEPALIVE_S)
        return StreamingResponse(iter(["data: one\n\n", "data: [DONE]\n\n"]), media_type="text/event-stream")

    response = _client(make).post("/v1/chat/completions")
    assert response.status_code == 200 and "content-length" not in response.headers
    assert response.headers["content-type"].startswith("text/event-stream")
    before, _, after = response.text.partition("data: one\n\n")
    assert before.count(": keep-alive\n\n") >= 3 and before.replace(": keep-alive\n\n", "") == ""
    assert after == "data: [DONE]\n\n"


def test_a_response_made_at_once_sends_no_keepalive():
    async def make():
        return StreamingResponse(iter(["data: one\n\n"]), media_type="text/event-stream")

    assert _client(make).post("/v1/chat/completions").text == "data: one\n\n"


def test_an_error_while_making_is_one_error_frame_in_the_dialect():
    async def make():
        await asyncio.sleep(3 * KEEPALIVE_S)
        raise ApiError(400, "prompt too long", param="messages", code="context_length_exceeded")

    openai = _client(make).post("/v1/chat/completions").text
    assert openai.endswith("data: [DONE]\n\n") and '"code":"context_length_exceeded"' in openai
    anthropic = _client(make).post("/v1/messages").text
    assert "event: error\ndata: " in anthropic and '"type":"invalid_request_error"' in anthropic
