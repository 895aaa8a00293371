"""Errors pick their dialect by path: Anthropic's shape (and 529 for overload) under /v1/messages."""

from __future__ import annotations

import json

from engine.errors import QueueFullError

from api.dialect import dialect_of, error_response, route_path, stream_error_frame
from api.errors import ApiError, from_engine_error


def test_the_dialect_follows_the_path():
    assert dialect_of("/v1/messages") == dialect_of("/v1/messages/count_tokens") == "anthropic"
    assert dialect_of("/v1/messagesx") == dialect_of("/v1/chat/completions") == "openai"
    assert route_path({"path": "/guarded/v1/messages", "root_path": "/guarded"}) == "/v1/messages"
    assert route_path({"path": "/v1/models", "root_path": ""}) == "/v1/models"


def test_queue_full_is_503_on_openai_and_529_on_anthropic_both_with_retry_after():
    error = from_engine_error(QueueFullError("the waiting queue is full"))
    openai = error_response("/v1/chat/completions", error)
    anthropic = error_response("/v1/messages", error)
    assert (openai.status_code, anthropic.status_code) == (503, 529)
    assert openai.headers["retry-after"] == anthropic.headers["retry-after"] == "1"
    assert json.loads(anthropic.body)["error"]["type"] == "overloaded_error"
    assert json.loads(openai.body)["error"]["code"] == "queue_full"


def test_a_stream_error_frame_in_each_dialect():
    error = ApiError(408, "too slow", type="timeout_error", code="request_timeout")
    openai = stream_error_frame("/v1/completions", error).decode()
    assert openai.endswith("data: [DONE]\n\n") and '"code":"request_timeout"' in openai
    anthropic = stream_error_frame("/v1/messages", error).decode()
    assert anthropic.startswith("event: error\ndata: ") and '"type":"timeout_error"' in anthropic


def test_a_stream_error_frame_stays_one_line_per_field_whatever_the_message():
    frame = stream_error_frame("/v1/chat/completions", ApiError(400, "bad\u2028input\x85here"))
    lines = [line for line in frame.decode().splitlines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) == 2
    assert json.loads(lines[0][len("data: ") :])["error"]["message"] == "bad\u2028input\x85here"
