"""What a client sees when a replica dies under its request: a retryable 503 (529 on /v1/messages).

Owns the mapping from Ray's actor-death errors to that ApiError, for the Scheduler streams
(deployments/generation.py) and, as a FastAPI exception handler, for every other handle call of the
Ingress (Tokenizer, Embedder). Ray Serve starts a new replica; a retry reaches a live one. The message
names no Ray internals (worker ids, addresses), which Ray's own error text is full of. Also owns the
other direction: the HTTP proxy that carried a request died (Serve shutting down), which for the app is
the client going away.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray.exceptions import RayActorError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.dialect import error_response, route_path
from api.errors import SERVER_ERROR, ApiError

logger = logging.getLogger(__name__)

REPLICA_RETRY_AFTER_S = 5  # Ray Serve routes to a surviving replica at once, or starts a new one


def replica_died() -> ApiError:
    message = "a server replica handling this request stopped; retry the request"
    headers = {"Retry-After": str(REPLICA_RETRY_AFTER_S)}
    return ApiError(503, message, type=SERVER_ERROR, code="replica_unavailable", headers=headers)


async def _handle_replica_died(request: Request, exc: Exception) -> JSONResponse:
    logger.warning("a replica died under %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(route_path(request.scope), replica_died())


def install_replica_died_handler(app: FastAPI) -> None:
    app.add_exception_handler(RayActorError, _handle_replica_died)


class ProxyGoneMiddleware:
    """A request's `receive` that fails because its Ray Serve proxy died (`serve run` stopping, Ctrl-C)
    reads as the client's disconnect, so open streams end quietly instead of each logging a traceback."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_or_disconnect() -> Message:
            try:
                return await receive()
            except RayActorError:
                return {"type": "http.disconnect"}

        await self.app(scope, receive_or_disconnect, send)
