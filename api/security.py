"""API-key auth: which key a request presents, a constant-time check, and the middleware that refuses.

Owns the accepted keys (as SHA-256 digests) and the open paths. A refusal is a 401 in the route's
dialect (api/dialect.py). Keys come from api/config.py's SecurityConfig; no Ray, no MLX.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from api.dialect import error_response, route_path
from api.errors import ApiError

# Probes and scrapers carry no key: these stay open whatever the config says.
OPEN_PATHS = frozenset({"/health", "/metrics"})


def presented_keys(headers: Headers) -> list[str]:
    """The keys a request sends: `Authorization: Bearer <key>` (OpenAI SDKs) and `x-api-key` (Anthropic's)."""
    keys = []
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credential.strip():
        keys.append(credential.strip())
    if api_key := headers.get("x-api-key", "").strip():
        keys.append(api_key)
    return keys


class KeyCheck:
    def __init__(self, keys: Iterable[str]):
        # Digests have one length, so compare_digest's time depends on neither key's length.
        self._digests = [_digest(key) for key in keys]

    def accepts(self, key: str) -> bool:
        candidate = _digest(key)
        found = False
        for digest in self._digests:  # no early exit: the time does not tell which key matched
            found |= hmac.compare_digest(digest, candidate)
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class AuthMiddleware:
    def __init__(self, app: ASGIApp, check: KeyCheck):
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope)
        if scope["type"] != "http" or path in OPEN_PATHS:
            return await self.app(scope, receive, send)
        keys = presented_keys(Headers(scope=scope))
        if any(self.check.accepts(key) for key in keys):
            return await self.app(scope, receive, send)
        await error_response(path, _refusal(bool(keys)))(scope, receive, send)


def _refusal(key_sent: bool) -> ApiError:
    if key_sent:
        message, code = "Incorrect API key provided.", "invalid_api_key"
    else:
        message = "Missing API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`."
        code = "missing_api_key"
    return ApiError(401, message, code=code, headers={"WWW-Authenticate": "Bearer"})
