"""The body-size limit (413) and the per-client rate limit (429 with Retry-After), as ASGI middlewares.

Owns how a request is measured and which client it counts against; the buckets are api/rate_limit.py's.
Refusals are rendered in the route's dialect (api/dialect.py). No Ray, no MLX.
"""

from __future__ import annotations

import hashlib
import math

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.dialect import error_response, route_path
from api.errors import ApiError
from api.rate_limit import TokenBuckets
from api.security import OPEN_PATHS, presented_keys


class BodyLimitMiddleware:
    """Refuses a declared Content-Length over the limit at once; counts a chunked body as it arrives."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            error = self.too_large(f"The request body has {declared} bytes")
            return await error_response(route_path(scope), error)(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                # Raised inside the route's body read, so the app's error handlers render it.
                raise self.too_large("The request body is larger")
            return message

        await self.app(scope, counting_receive, send)

    def too_large(self, what: str) -> ApiError:
        message = f"{what}, over this server's limit of {self.max_body_bytes} bytes (limits.max_body_bytes)."
        return ApiError(413, message, code="request_too_large")


class RateLimitMiddleware:
    """One bucket per client: its API key when auth is on (the key is checked by then), else its IP."""

    def __init__(self, app: ASGIApp, buckets: TokenBuckets, by_key: bool):
        self.app = app
        self.buckets = buckets
        self.by_key = by_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope)
        if scope["type"] != "http" or path in OPEN_PATHS:
            return await self.app(scope, receive, send)
        wait_s = self.buckets.acquire(self.client_of(scope))
        if wait_s is None:
            return await self.app(scope, receive, send)
        retry_after = max(1, math.ceil(wait_s))
        error = ApiError(
            429,
            f"Rate limit reached for this client; retry after {retry_after} s.",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )
        await error_response(path, error)(scope, receive, send)

    def client_of(self, scope: Scope) -> str:
        keys = presented_keys(Headers(scope=scope)) if self.by_key else []
        if keys:
            return "key:" + hashlib.sha256(keys[0].encode()).hexdigest()
        client = scope.get("client")
        return "ip:" + (client[0] if client else "unknown")
