"""Which API dialect a path speaks, and that dialect's error body, status and stream error frame.

Owns the choice only: api/errors.py owns OpenAI's shape, api/anthropic_errors.py Anthropic's. Every
error path that is not a route's own (the exception handlers, the guard middlewares, the timeout)
renders through here, so /v1/messages* failures are Anthropic-shaped and the rest OpenAI-shaped.
"""

from __future__ import annotations

from typing import Any, Literal

from starlette.responses import JSONResponse
from starlette.types import Scope

from api import anthropic_errors
from api.errors import ApiError
from api.sse import frame_json

Dialect = Literal["openai", "anthropic"]
# Anthropic answers an overloaded server with its own 529 where OpenAI uses 503.
_ANTHROPIC_OVERLOADED = 529


def route_path(scope: Scope) -> str:
    """The path below the app's route prefix (Ray Serve mounts an app at its `route_prefix`)."""
    path, root = scope.get("path", "/"), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


def dialect_of(path: str) -> Dialect:
    prefix = anthropic_errors.ROUTE_PREFIX
    return "anthropic" if path == prefix or path.startswith(prefix + "/") else "openai"


def error_status(dialect: Dialect, exc: ApiError) -> int:
    if dialect == "anthropic" and exc.status == 503:
        return _ANTHROPIC_OVERLOADED
    return exc.status


def error_body(dialect: Dialect, exc: ApiError) -> dict[str, Any]:
    if dialect == "openai":
        return exc.body()
    body = anthropic_errors.error_body(exc)
    if exc.status == 408:
        body["error"]["type"] = "timeout_error"  # Anthropic's name for a request that ran too long
    return body


def error_response(path: str, exc: ApiError) -> JSONResponse:
    dialect = dialect_of(path)
    return JSONResponse(error_body(dialect, exc), status_code=error_status(dialect, exc), headers=exc.headers)


def stream_error_frame(path: str, exc: ApiError) -> bytes:
    """The SSE event that ends a stream which already sent its status line (OpenAI adds `[DONE]`)."""
    dialect = dialect_of(path)
    data = frame_json(error_body(dialect, exc))
    if dialect == "anthropic":
        return f"event: error\ndata: {data}\n\n".encode()
    return f"data: {data}\n\ndata: [DONE]\n\n".encode()
