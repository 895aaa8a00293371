"""Anthropic's error shape for the /v1/messages routes: `{"type": "error", "error": {"type", "message"}}`.

Owns the mapping from an `ApiError`'s status to Anthropic's error types; api/dialect.py decides which
routes use it (every path under ROUTE_PREFIX) and their status codes. No Ray, no MLX.
"""

from __future__ import annotations

from typing import Any

from api.errors import ApiError

ROUTE_PREFIX = "/v1/messages"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(exc: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(exc.status), "message": exc.message}}
