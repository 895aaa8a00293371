"""The HTTP guard: CORS, body limit, API keys, rate limit and timeout, in that order, around the routes.

Owns the order and the lazy build. The Ingress learns its config in its constructor, after the app was
frozen by @serve.ingress, so the chain is built on the first request from a `configs` callable.
Order: CORS outermost (preflights answered, refusals carry CORS headers), then the cheap refusals
(size, key, rate) before any work, then the timeout around the route itself.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from api.config import LimitsConfig, SecurityConfig
from api.limits import BodyLimitMiddleware, RateLimitMiddleware
from api.rate_limit import TokenBuckets
from api.security import AuthMiddleware, KeyCheck
from api.timeout import TimeoutMiddleware

Configs = Callable[[], tuple[SecurityConfig, LimitsConfig]]


def guarded(app: ASGIApp, security: SecurityConfig, limits: LimitsConfig) -> ASGIApp:
    if limits.request_timeout_s is not None:
        app = TimeoutMiddleware(app, limits.request_timeout_s)
    if (rate := limits.rate_limit) is not None:
        buckets = TokenBuckets(rate.requests_per_minute / 60.0, rate.bucket_size)
        app = RateLimitMiddleware(app, buckets, by_key=bool(security.api_keys))
    if security.api_keys:
        app = AuthMiddleware(app, KeyCheck(security.api_keys))
    app = BodyLimitMiddleware(app, limits.max_body_bytes)
    if security.cors_allow_origins:
        app = CORSMiddleware(
            app,
            allow_origins=security.cors_allow_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
            max_age=600,
        )
    return app


class GuardMiddleware:
    """Install with `app.add_middleware(GuardMiddleware, configs=...)`."""

    def __init__(self, app: ASGIApp, configs: Configs):
        self.app = app
        self.configs = configs
        self._guarded: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self._guarded is None:
            self._guarded = guarded(self.app, *self.configs())
        await self._guarded(scope, receive, send)
