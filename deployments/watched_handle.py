"""Deployment handles whose calls fail fast while their deployment is down (deployments/deployment_health.py).

Owns only the wrapping: a unary call is guarded until it answers, a stream until its first item (from
then on it is bound to a live replica, whose death Ray reports as RayActorError). Call sites use the
wrapper as they would the handle: `await handle.method.remote(...)`, `handle.options(stream=True)`.
"""

from __future__ import annotations

from typing import Any

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from deployments.deployment_health import DeploymentWatch


class WatchedHandle:
    def __init__(self, handle: DeploymentHandle, watch: DeploymentWatch):
        self._handle = handle
        self._watch = watch
        self.deployment_name: str = handle.deployment_name

    def options(self, **options: Any) -> WatchedHandle:
        return WatchedHandle(self._handle.options(**options), self._watch)

    def broadcast(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Reaches the running replicas only, so it never waits for a dead deployment."""
        self._watch.check(self.deployment_name)
        return self._handle.broadcast(method, *args, **kwargs)

    def __getattr__(self, method: str) -> _WatchedMethod:
        return _WatchedMethod(getattr(self._handle, method), self.deployment_name, self._watch)


class _WatchedMethod:
    def __init__(self, method: Any, deployment_name: str, watch: DeploymentWatch):
        self._method, self._name, self._watch = method, deployment_name, watch

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._watch.check(self._name)  # known down: no call at all
        response = self._method.remote(*args, **kwargs)
        if isinstance(response, DeploymentResponseGenerator):
            return WatchedStream(response, self._name, self._watch)
        return self._watch.guard(self._name, response)


class WatchedStream:
    def __init__(self, stream: DeploymentResponseGenerator, deployment_name: str, watch: DeploymentWatch):
        self._stream, self._name, self._watch = stream, deployment_name, watch
        self._first = True

    def __aiter__(self) -> WatchedStream:
        return self

    async def __anext__(self) -> Any:
        if not self._first:
            return await self._stream.__anext__()
        self._first = False
        return await self._watch.guard(self._name, self._stream.__anext__())

    def cancel(self) -> None:
        self._stream.cancel()
