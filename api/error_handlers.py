"""The FastAPI exception handlers that make every failure an error in its route's dialect.

Owns only the mapping from exception classes to `ApiError`s (api/errors.py) and their rendering through
api/dialect.py, so routes under /v1/messages answer in Anthropic's shape and FastAPI's own
`{"detail": ...}` never reaches a client. No Ray, no MLX.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.dialect import error_response, route_path
from api.errors import INVALID_REQUEST, SERVER_ERROR, ApiError, from_validation_errors, internal_error

logger = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _handle_api_error)
    app.add_exception_handler(RequestValidationError, _handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, _handle_http_exception)
    app.add_exception_handler(Exception, _handle_unexpected)


def _render(request: Request, error: ApiError) -> JSONResponse:
    """The error in the dialect of the route that failed (Anthropic's under /v1/messages)."""
    return error_response(route_path(request.scope), error)


async def _handle_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _render(request, exc)


async def _handle_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _render(request, from_validation_errors(exc.errors()))


async def _handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = str(exc.detail)
    if exc.status_code == 404:
        message = f"No route {request.method} {request.url.path}."
    kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    return _render(request, ApiError(exc.status_code, message, type=kind, code=code))


async def _handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error in a request")
    return _render(request, internal_error(f"internal error: {type(exc).__name__}: {exc}"))
