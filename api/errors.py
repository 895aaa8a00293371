"""OpenAI error JSON: the one place where engine errors and request failures become status codes.

Owns `ApiError`, the shape `{"error": {"message", "type", "param", "code"}}` and the builders of each
kind of failure; api/error_handlers.py makes every failure of the app use it. No Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.errors import ContextLengthExceededError, EngineError, InvalidRequestError, QueueFullError

from fastapi.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# A full waiting queue drains within about a second of decode steps on the bundled model.
QUEUE_FULL_RETRY_AFTER_S = 1


class ApiError(Exception):
    """A failure of one HTTP request, already in OpenAI's terms."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # e.g. Retry-After on 429 and 503

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def unsupported(param: str, detail: str) -> ApiError:
    """A parameter this server understands but does not honour yet: never dropped silently."""
    return ApiError(400, f"'{param}' is not supported: {detail}", param=param, code="unsupported_parameter")


def invalid(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def model_not_found(model: str, available: Sequence[str]) -> ApiError:
    names = ", ".join(repr(name) for name in available)
    message = f"The model '{model}' does not exist; this server serves {names}."
    return ApiError(404, message, param="model", code="model_not_found")


def from_engine_error(exc: EngineError, prompt_param: str | None = None) -> ApiError:
    """Maps the engine's typed errors; `prompt_param` names the field a context overflow blames."""
    if isinstance(exc, ContextLengthExceededError):
        # The engine cannot tell chat from completions; the prompt is `messages` or `prompt` by route.
        blamed = prompt_param if exc.param in (None, "messages", "prompt") else exc.param
        return ApiError(400, exc.message, param=blamed, code=exc.code)
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, QueueFullError):
        retry = {"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)}
        return ApiError(503, exc.message, type=SERVER_ERROR, code=exc.code, headers=retry)
    return ApiError(500, exc.message, type=SERVER_ERROR, param=exc.param, code=exc.code)


def internal_error(message: str, code: str = "internal_error") -> ApiError:
    return ApiError(500, message, type=SERVER_ERROR, code=code)


def from_validation_errors(errors: Sequence[Any]) -> ApiError:
    """Pydantic / FastAPI validation errors -> one 400 naming the first offending parameter."""
    # An unknown field is named first: it is usually the cause of whatever else failed.
    ranked = sorted(errors, key=lambda e: e.get("type") != "extra_forbidden")
    first = dict(ranked[0]) if ranked else {"type": "missing", "loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = _param_path(loc) or None
    kind, detail = first.get("type"), str(first.get("msg", ""))
    if kind == "json_invalid":
        return ApiError(400, "The request body is not valid JSON: " + detail, code="invalid_json")
    if kind == "extra_forbidden":
        return ApiError(
            400, f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
        )
    if kind == "missing":
        return ApiError(
            400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    message = first.get("msg", "invalid")
    if param is None:
        return ApiError(400, f"Invalid request body: {message}", code="invalid_value")
    return ApiError(400, f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def _param_path(loc: list[str]) -> str:
    """('messages', '0', 'role') -> 'messages[0].role', the way OpenAI names nested params."""
    path = ""
    for part in loc:
        if part.isdigit():
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path
