"""The request timeout, as an ASGI middleware: past the limit the route is cancelled, which aborts its
engine requests (the routes cancel their Scheduler streams on the way out), and the client is told.

Owns the deadline and what the client sees: a 408 in the route's dialect if nothing was sent yet, an
error event that ends the stream if a stream had started. No Ray, no MLX.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.dialect import error_response, route_path, stream_error_frame
from api.errors import ApiError

logger = logging.getLogger(__name__)


class _Progress:
    """What the route has sent so far."""

    def __init__(self, send: Send):
        self._send = send
        self.started = self.ended = self.streaming = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = dict(message.get("headers", []))
            self.streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)


class TimeoutMiddleware:
    def __init__(self, app: ASGIApp, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        progress = _Progress(send)
        task = asyncio.ensure_future(self.app(scope, receive, progress.send))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        except asyncio.CancelledError:  # the server dropped the request: take the route down with it
            task.cancel()
            raise
        if done:
            return task.result()
        task.cancel()
        await asyncio.wait({task})  # lets the route's cleanup (engine aborts) run before answering
        await self._tell(scope, receive, send, progress)

    async def _tell(self, scope: Scope, receive: Receive, send: Send, progress: _Progress) -> None:
        path = route_path(scope)
        error = ApiError(
            408,
            f"The request took longer than this server's limit of {self.timeout_s:g} s "
            "(limits.request_timeout_s) and was cancelled.",
            type="timeout_error",
            code="request_timeout",
        )
        logger.warning("request %s %s timed out after %.1f s", scope.get("method"), path, self.timeout_s)
        if not progress.started:
            await error_response(path, error)(scope, receive, send)
        elif not progress.ended:
            body = stream_error_frame(path, error) if progress.streaming else b""
            await send({"type": "http.response.body", "body": body, "more_body": False})
