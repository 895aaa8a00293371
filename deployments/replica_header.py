"""Names the Ingress replica that answered, in a response header, for operators who scale the Ingress out.

Owns the header only: `x-mlx-ray-serve-replica: <Ray Serve replica id>` on every HTTP response.
"""

from __future__ import annotations

from functools import cache

from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-mlx-ray-serve-replica"


@cache
def _replica_id() -> bytes:
    unique_id: str = serve.get_replica_context().replica_id.unique_id
    return unique_id.encode()


class ReplicaHeaderMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER, _replica_id())]}
            await send(message)

        await self.app(scope, receive, send_with_header)
