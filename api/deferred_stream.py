"""An SSE response whose real response is not made yet: a stream to a model that is still starting.

Owns only the wire while it waits: the status line and headers at once, a keep-alive comment every
`keepalive_s`, then the made stream's own bytes, or its error as one SSE error frame (the status line is
gone by then). Makes nothing itself; no Ray, no MLX.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from api.dialect import route_path, stream_error_frame
from api.errors import ApiError, internal_error
from api.sse import HEADERS, KEEPALIVE, MEDIA_TYPE

logger = logging.getLogger(__name__)


class DeferredEventStream(Response):
    def __init__(self, make: Callable[[], Awaitable[Response]], keepalive_s: float):
        # As StreamingResponse does: no body, so no content-length header (Response's would say 0).
        self.status_code, self.media_type, self.background = 200, MEDIA_TYPE, None
        self.init_headers(HEADERS)
        self._make = make
        self._keepalive_s = keepalive_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        made = asyncio.ensure_future(self._make())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            while not made.done():
                await asyncio.wait({made}, timeout=self._keepalive_s)
                if not made.done():
                    await _body(send, KEEPALIVE.encode())
            await self._finish(made, scope, receive, send)
        finally:
            if not made.done():  # the client left while the model started: stop making the response
                made.cancel()
                with contextlib.suppress(BaseException):
                    await made
            elif not made.cancelled() and made.exception() is None:
                _close(made.result())

    async def _finish(
        self, made: asyncio.Future[Response], scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            response = made.result()
        except ApiError as exc:
            await _body(send, stream_error_frame(route_path(scope), exc), more=False)
            return
        except Exception as exc:
            logger.exception("a deferred stream failed before its first frame")
            error = internal_error(f"internal error: {type(exc).__name__}: {exc}")
            await _body(send, stream_error_frame(route_path(scope), error), more=False)
            return
        if isinstance(response, StreamingResponse):
            await response(scope, receive, _without_start(send))
            return
        # A whole response (an error the route rendered itself): its body as the stream's error frame.
        await _body(send, b"data: " + bytes(response.body) + b"\n\n", more=False)


async def _body(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


def _without_start(send: Send) -> Send:
    """The made stream's messages minus its own status line, which this response already sent."""

    async def forward(message: Message) -> None:
        if message["type"] != "http.response.start":
            await send(message)

    return forward


def _close(response: Response) -> None:
    """A made stream that never ran still holds its generation: its `close` lets it go (api/sse.py)."""
    close = getattr(response, "close", None)
    if callable(close):
        close()
