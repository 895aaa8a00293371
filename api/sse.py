"""Server-sent events framing: OpenAI's `data: {json}\\n\\n` frames ending in `data: [DONE]\\n\\n`, and
the named `event: <type>\\ndata: {json}\\n\\n` frames of Anthropic's and the Responses API's streams.

Owns the bytes on the wire and the streaming response that carries them, keep-alive comments
included; what goes in a frame is the converters' business.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

MEDIA_TYPE = "text/event-stream"
DONE = "data: [DONE]\n\n"
# Proxies (nginx) buffer text/event-stream unless told not to; clients must see each frame at once.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# An SSE comment: every SSE client skips it. Sent while a request waits for a slot, so that proxies
# (nginx closes after 60 s by default) and clients with read timeouts keep the stream open.
KEEPALIVE = ": keep-alive\n\n"


# JSON leaves these raw inside strings, but line readers built on str.splitlines (httpx's
# `aiter_lines`, among others) end a line at each, cutting a `data:` line in two.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: dict[str, Any]) -> str:
    return f"data: {frame_json(payload)}\n\n"


def named_event(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {frame_json(payload)}\n\n"


def frame_json(payload: dict[str, Any]) -> str:
    """One line of JSON for a `data:` field: UTF-8 kept, every character a line reader may split at escaped."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)


async def with_keepalive(
    frames: AsyncIterator[str], heartbeat: Callable[[], Awaitable[None]]
) -> AsyncIterator[str]:
    """`frames`, plus a KEEPALIVE at each `heartbeat()` that comes while no frame does: the engine says
    the request still waits for a slot. A stream whose engine went silent gets none."""
    frame: asyncio.Future[str] | None = None
    beat: asyncio.Future[None] | None = None
    try:
        while True:
            frame = frame or asyncio.ensure_future(anext(frames))
            beat = beat or asyncio.ensure_future(heartbeat())
            either: set[asyncio.Future[Any]] = {frame, beat}
            done, _ = await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if beat in done:
                beat = None
                if frame not in done:
                    yield KEEPALIVE
                    continue
            finished, frame = frame, None
            try:
                text = finished.result()
            except StopAsyncIteration:
                return
            yield text
    finally:  # finished, or the client left / the route was cancelled mid-wait
        waits = [task for task in (frame, beat) if task is not None]
        for task in waits:
            task.cancel()
        if waits:
            await asyncio.wait(waits)
        await frames.aclose()  # type: ignore[attr-defined]


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response with keep-alives (`with_keepalive`) that calls `on_close` however it
    ends: finished, failed, or cut off by a client that left before the first frame (when the frames'
    own cleanup never got to run)."""

    def __init__(
        self,
        frames: AsyncIterator[str],
        on_close: Callable[[], None],
        heartbeat: Callable[[], Awaitable[None]],
    ):
        super().__init__(with_keepalive(frames, heartbeat), media_type=MEDIA_TYPE, headers=HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.close()

    def close(self) -> None:
        """Lets go of what the frames hold (once), also for a response that never ran."""
        on_close, self._on_close = self._on_close, _nothing
        on_close()


def _nothing() -> None:
    pass
