"""The Ingress's view of whether each deployment it calls can serve now, read from Ray Serve's controller.

Owns the polling of Ray Serve's controller and the fail-fast rule: a call to a deployment that is down (no
replica runs, and its replicas failed to start: a model that cannot load, a crash while loading)
becomes a 503 naming the cause within about a second, where Ray Serve's router would hold it until the
request timeout. A replica that died while serving is restarted by Ray Serve, and calls wait for it
unless the restart fails too. Restarts nothing itself; a deployment that comes back serves again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ray.serve.exceptions import DeploymentUnavailableError

from api.errors import SERVER_ERROR, ApiError

logger = logging.getLogger(__name__)
# Ray Serve writes this logger's records to the replica's log, the dashboard and `serve run`'s terminal.
serve_logger = logging.getLogger("ray.serve")

POLL_INTERVAL_S = 1.0
FULL_READ_EVERY_S = 30.0  # ServeStatusReader: the replica counts' refresh while nothing changes
UNSETTLED_FULL_READ_EVERY_S = 5.0  # ... and while a deployment is not HEALTHY (a model loading)
DOWN_RETRY_AFTER_S = 10
_MAX_CAUSE_CHARS = 400
# Ray Serve's messages for replicas that failed to start or died (deployment_state.py, Ray 2.60).
_START_FAILED = "failed to start"

T = TypeVar("T")


@dataclass(frozen=True)
class DeploymentState:
    name: str
    status: str  # Ray Serve's: HEALTHY, UPDATING, UNHEALTHY, DEPLOY_FAILED, UPSCALING, DOWNSCALING
    num_running: int  # replicas in state RUNNING
    problem: str | None  # why no replica can serve; None: one can, or one is (re)starting
    message: str | None = None  # Ray Serve's word while no replica runs (why it is restarting, ...)

    def describe(self) -> dict[str, Any]:
        described = {"status": self.status, "num_running": self.num_running, "problem": self.problem}
        return described | ({"message": self.message} if self.message else {})


def deployment_state(
    name: str, status: str, replica_states: Mapping[str, int], message: str
) -> DeploymentState:
    """The rule: down means no RUNNING replica and Ray Serve has seen a replica fail to start (or gave
    up). No running replica otherwise is a deployment starting, restarting a replica that died while
    serving, or scaled to zero: calls wait for it."""
    num_running = int(replica_states.get("RUNNING", 0))
    if num_running:
        return DeploymentState(name, status, num_running, None)
    cause = _cause(status, message)
    failed = status == "DEPLOY_FAILED" or _START_FAILED in message.lower()
    return DeploymentState(name, status, 0, cause if failed else None, cause if message.strip() else None)


def _cause(status: str, message: str) -> str:
    """Ray Serve's first line (what happened) and the error's last line (why), without the traceback."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return f"Ray Serve reports it {status} with no running replica"
    head, last = lines[0].removesuffix("Error:").strip(), lines[-1]
    cause = head if last == lines[0] else f"{head} {last}"
    return cause if len(cause) <= _MAX_CAUSE_CHARS else cause[: _MAX_CAUSE_CHARS - 3] + "..."


def deployment_down(state: DeploymentState, model: str | None = None) -> ApiError:
    subject = (
        f"the model {model!r} cannot serve: its {state.name} deployment"
        if model
        else f"the {state.name} deployment cannot serve:"
    )
    message = (
        f"{subject} {state.problem} "
        "Ray Serve keeps retrying; see `serve status` or the Ray dashboard, fix the cause "
        "(serve_config.yaml, the model) and restart `serve run`"
    )
    headers = {"Retry-After": str(DOWN_RETRY_AFTER_S)}
    return ApiError(503, message, type=SERVER_ERROR, code="deployment_unavailable", headers=headers)


def health_body(
    states: dict[str, DeploymentState], on_demand: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    """/health's answer: "ok" when every deployment has a running replica (or is scaled to zero, or is an
    `on_demand` model's), "unhealthy" while one is down (its problem in `error`), "starting" while one
    has no replica yet."""
    down = {name: s.problem for name, s in sorted(states.items()) if s.problem}
    starting = [
        n for n, s in states.items()
        if s.num_running == 0 and not s.problem and s.status != "HEALTHY" and n not in on_demand
    ]  # fmt: skip
    status = "unhealthy" if down else "starting" if starting or not states else "ok"
    body: dict[str, Any] = {
        "status": status,
        "deployments": {n: s.describe() for n, s in sorted(states.items())},
    }
    if down:
        body["error"] = "; ".join(f"{name} cannot serve: {problem}" for name, problem in down.items())
    return body


class ServeStatusReader:
    """Reads the states of `app_name`'s deployments from Ray Serve's controller, cheaply enough to poll
    every second beside the model's step (blocking; run it in a thread).

    Each read asks for the compact status (`get_serve_status`: each deployment's status and message).
    The replica counts come with the full details, which cost the controller and this process about
    150 ms of CPU each (`serve.status()` rebuilds every deployment's config, pickling its router
    class): they are read again when the compact status changes, every `unsettled_every_s` while a
    deployment is not HEALTHY (read every second, the Scheduler's 10-20 s model load cost the
    controller a sixth of a core on 2 cores, beside the load), and every `full_every_s` otherwise.
    What decides that a deployment cannot serve (DEPLOY_FAILED, or "failed to start" in its message:
    `deployment_state`) is in the compact status, and a change there reads the counts at once, so the
    cached counts never hide a failure.
    """

    def __init__(
        self,
        app_name: str,
        client: Any = None,
        full_every_s: float = FULL_READ_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        unsettled_every_s: float = UNSETTLED_FULL_READ_EVERY_S,
    ):
        self._app_name = app_name
        self._client = client
        self._full_every_s = full_every_s
        self._unsettled_every_s = unsettled_every_s
        self._clock = clock
        self._last_compact: tuple[tuple[str, str, str], ...] | None = None
        self._last_full_s = -float("inf")
        self._states: dict[str, DeploymentState] = {}

    def __call__(self) -> dict[str, DeploymentState]:
        client = self._client or _serve_client()
        overview = client.get_serve_status(self._app_name)
        compact = tuple(
            sorted((d.name, _name(d.status), d.message or "") for d in overview.deployment_statuses)
        )
        settled = all(status == "HEALTHY" for _, status, _ in compact)
        age_s = self._clock() - self._last_full_s
        stale = age_s >= (self._full_every_s if settled else self._unsettled_every_s)
        if compact != self._last_compact or stale:
            self._states = self._read_full(client)
            self._last_compact, self._last_full_s = compact, self._clock()
        return dict(self._states)

    def _read_full(self, client: Any) -> dict[str, DeploymentState]:
        # The controller's plain dict (schema ServeInstanceDetails), read without building its models.
        app = (client.get_serve_details().get("applications") or {}).get(self._app_name)
        if app is None:
            return {}
        states = {}
        for name, d in (app.get("deployments") or {}).items():
            replicas = Counter(_name(r.get("state")) for r in d.get("replicas") or [])
            states[name] = deployment_state(name, _name(d.get("status")), replicas, d.get("message") or "")
        return states


def _name(value: Any) -> str:
    """A status as Ray Serve names it: the dict holds its enums (`str()` of one gives "Class.NAME")."""
    return str(getattr(value, "value", value) or "")


def _serve_client() -> Any:
    from ray.serve.context import _get_global_client  # what serve.status() itself uses

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        raise RuntimeError("no Ray Serve controller is running")
    return client


class DeploymentWatch:
    """Polls the deployments' states once a second while the Ingress serves; `guard` a call with it."""

    def __init__(self, read: Callable[[], dict[str, DeploymentState]], interval_s: float = POLL_INTERVAL_S):
        self._read = read
        self._interval_s = interval_s
        self._states: dict[str, DeploymentState] = {}
        self._changed = asyncio.Event()  # set and replaced on every poll that changes a problem
        self._task: asyncio.Task[None] | None = None
        # Its own thread: the event loop's default executor is shut down before the replica's end.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-status")
        self._closed = False

    def states(self) -> dict[str, DeploymentState]:
        return dict(self._states)

    def check(self, name: str) -> None:
        """Raises the 503 of `name` if it is down now."""
        state = self._states.get(name)
        if state is not None and state.problem is not None:
            raise deployment_down(state)

    async def guard(self, name: str, call: Awaitable[T]) -> T:
        """`call`'s result, or the 503 of `name` as soon as a poll finds it down (the call is cancelled)."""
        self.ensure_polling()
        work = asyncio.ensure_future(call)
        try:
            while True:
                self.check(name)
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    done, _ = await asyncio.wait({work, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if work in done:
                    try:
                        return work.result()
                    except DeploymentUnavailableError:  # Ray Serve gave up on it before a poll saw it
                        raise deployment_down(self._failed(name)) from None
        finally:
            if not work.done():
                work.cancel()

    def _failed(self, name: str) -> DeploymentState:
        state = self._states.get(name)
        if state is not None and state.problem is not None:
            return state
        return DeploymentState(name, "DEPLOY_FAILED", 0, "Ray Serve reports that it failed to deploy.")

    def ensure_polling(self) -> None:
        # From the Ingress's constructor, which Ray Serve runs on the replica's event loop; else (no
        # loop there) from the first request.
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def refresh(self) -> dict[str, DeploymentState]:
        """Reads the states now (for /health) and applies them; keeps polling from then on."""
        self.ensure_polling()
        self.apply(await asyncio.get_running_loop().run_in_executor(self._executor, self._read))
        return self.states()

    def close(self) -> None:
        """Stops polling (the Ingress's shutdown)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _poll_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                self.apply(await loop.run_in_executor(self._executor, self._read))
            except Exception:
                if self._closed:  # the executor was shut down under the read: the replica is stopping
                    return
                logger.exception("reading Ray Serve's deployment status failed; retrying")
            await asyncio.sleep(self._interval_s)

    def apply(self, states: dict[str, DeploymentState]) -> None:
        changed = False
        for name, state in list(states.items()):
            before = self._states.get(name)
            if state.num_running == 0 and state.problem is None and before and before.problem:
                # Ray Serve's message moves on while it retries ("slow to initialize"); the
                # deployment stays down until a replica runs.
                states[name] = state = replace(state, problem=before.problem)
            if (before.problem if before else None) != state.problem:
                changed = True
                if state.problem is not None:
                    serve_logger.error(
                        "%s cannot serve, requests that need it get 503: %s", name, state.problem
                    )
                elif before is not None:
                    serve_logger.warning("%s serves again (%d running replicas)", name, state.num_running)
        self._states = dict(states)
        if changed:
            self._changed.set()
            self._changed = asyncio.Event()
