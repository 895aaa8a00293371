"""The Ingress's fail-fast rule, driven by Ray Serve status snapshots given by hand (no Ray here)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.serve._private.common import DeploymentStatus, ReplicaState

from api.errors import ApiError
from deployments.deployment_health import (
    DeploymentState,
    DeploymentWatch,
    ServeStatusReader,
    deployment_state,
    health_body,
)

TRACEBACK = (
    "A replica failed to start with exception. Retrying 2 more time(s). Error:\n"
    "ray::ServeReplica:llm:Scheduler.initialize_and_get_metadata() (pid=1, ip=127.0.0.1)\n"
    '  File "engine/models/model_loader.py", line 80, in load_model\n'
    "engine.errors.ModelLoadError: could not load model '/nope': no such directory."
)
DIED = "A replica's health check failed. This deployment will be UNHEALTHY until the replica recovers."
SLOW = (
    "Deployment 'Scheduler' in application 'llm' has 1 replicas that have taken more than 30s to initialize."
)


def test_a_deployment_that_failed_to_start_is_down_with_ray_serves_line_and_the_error():
    state = deployment_state("Scheduler", "UPDATING", {"STARTING": 1}, TRACEBACK)
    assert state.problem == (
        "A replica failed to start with exception. Retrying 2 more time(s). "
        "engine.errors.ModelLoadError: could not load model '/nope': no such directory."
    )
    assert deployment_state("Scheduler", "DEPLOY_FAILED", {}, "").problem


def test_a_running_replica_a_slow_start_or_a_restart_after_a_death_is_not_down():
    running = deployment_state("Scheduler", "UNHEALTHY", {"RUNNING": 1, "STARTING": 1}, TRACEBACK)
    assert running.problem is None
    assert deployment_state("Scheduler", "UPDATING", {"STARTING": 1}, SLOW).problem is None
    assert deployment_state("Embedder", "HEALTHY", {}, "").problem is None  # scaled to zero
    # A replica that died while serving: Ray Serve starts another, and calls wait for it.
    restarting = deployment_state("Tokenizer", "UNHEALTHY", {"STARTING": 1}, DIED)
    assert restarting.problem is None and restarting.message == DIED
    assert health_body({"Tokenizer": restarting})["deployments"]["Tokenizer"]["message"] == DIED


def _watch(states: list[DeploymentState]) -> DeploymentWatch:
    return DeploymentWatch(lambda: {s.name: s for s in states}, interval_s=0.01)


def test_a_deployment_stays_down_while_ray_serve_retries_with_a_new_message():
    watch = _watch([])
    watch.apply({"Scheduler": deployment_state("Scheduler", "UPDATING", {"STARTING": 1}, TRACEBACK)})
    watch.apply({"Scheduler": deployment_state("Scheduler", "UPDATING", {"STARTING": 1}, SLOW)})
    with pytest.raises(ApiError) as raised:
        watch.check("Scheduler")
    assert raised.value.status == 503 and "no such directory" in raised.value.message
    watch.apply({"Scheduler": deployment_state("Scheduler", "HEALTHY", {"RUNNING": 1}, "")})
    watch.check("Scheduler")  # serves again


def test_a_call_waiting_for_a_deployment_fails_as_soon_as_a_poll_finds_it_down():
    starting = [deployment_state("Scheduler", "UPDATING", {"STARTING": 1}, "")]
    watch = _watch(starting)

    async def scenario() -> tuple[ApiError, bool]:
        never = asyncio.get_running_loop().create_future()  # a call queued with no replica to run it
        guarded = asyncio.ensure_future(watch.guard("Scheduler", never))
        await asyncio.sleep(0.05)
        assert not guarded.done()  # starting: the call waits
        starting[0] = deployment_state("Scheduler", "UPDATING", {"STARTING": 1}, TRACEBACK)
        with pytest.raises(ApiError) as raised:
            await asyncio.wait_for(guarded, 1)
        return raised.value, never.cancelled()

    error, cancelled = asyncio.run(scenario())
    assert error.status == 503 and error.code == "deployment_unavailable" and cancelled
    assert error.headers == {"Retry-After": "10"}


def test_a_guarded_call_returns_its_result():
    watch = _watch([deployment_state("Tokenizer", "HEALTHY", {"RUNNING": 1}, "")])

    async def call() -> int:
        await asyncio.sleep(0.02)
        return 7

    assert asyncio.run(watch.guard("Tokenizer", call())) == 7


def test_health_is_ok_only_when_every_deployment_runs_and_names_what_is_down():
    ok = {"Scheduler": deployment_state("Scheduler", "HEALTHY", {"RUNNING": 2}, "")}
    assert health_body(ok)["status"] == "ok"
    starting = ok | {"Embedder": deployment_state("Embedder", "UPDATING", {"STARTING": 1}, "")}
    assert health_body(starting)["status"] == "starting"
    down = ok | {"Embedder": deployment_state("Embedder", "DEPLOY_FAILED", {}, TRACEBACK)}
    body = health_body(down)
    assert body["status"] == "unhealthy" and body["error"].startswith("Embedder cannot serve: A replica")
    assert body["deployments"]["Scheduler"] == {"status": "HEALTHY", "num_running": 2, "problem": None}


class FakeController:
    """Ray Serve's controller client as ServeStatusReader sees it: a compact status per call, and the
    full details (a plain dict) counted, since each full read costs the controller ~150 ms of CPU."""

    def __init__(self) -> None:
        self.status = {"Scheduler": ("HEALTHY", ""), "Ingress": ("HEALTHY", "")}
        self.replicas = {"Scheduler": ["RUNNING"], "Ingress": ["RUNNING", "RUNNING"]}
        self.full_reads = 0

    def get_serve_status(self, app_name: str) -> SimpleNamespace:
        return SimpleNamespace(
            deployment_statuses=[
                SimpleNamespace(name=n, status=SimpleNamespace(value=s), message=m)
                for n, (s, m) in self.status.items()
            ]
        )

    def get_serve_details(self) -> dict:
        """As Ray Serve 2.60's controller returns it: statuses and replica states as its enums."""
        self.full_reads += 1
        deployments = {
            n: {
                "status": DeploymentStatus(s),
                "message": m,
                "replicas": [{"state": ReplicaState(r)} for r in self.replicas[n]],
            }
            for n, (s, m) in self.status.items()
        }
        return {"applications": {"llm": {"deployments": deployments}}}


def test_the_status_reader_reads_replica_counts_again_only_when_the_status_changes():
    controller, now = FakeController(), [0.0]
    read = ServeStatusReader("llm", controller, full_every_s=30.0, clock=lambda: now[0])
    states = read()
    assert states["Ingress"].num_running == 2 and states["Scheduler"].status == "HEALTHY"
    assert states["Scheduler"].problem is None
    for _ in range(5):  # steady and healthy: the compact status alone
        now[0] += 1.0
        assert read() == states
    assert controller.full_reads == 1
    controller.status["Scheduler"] = ("UPDATING", TRACEBACK)  # a replica failed to start
    controller.replicas["Scheduler"] = ["STARTING"]
    assert "no such directory" in (read()["Scheduler"].problem or "")  # a changed status: read at once
    assert controller.full_reads == 2
    now[0] += 1.0
    read()  # not HEALTHY, unchanged: the counts every unsettled_every_s (5 s), not every poll
    assert controller.full_reads == 2
    controller.replicas["Scheduler"] = ["RUNNING"]  # a second try came up; the status lags behind
    now[0] += 4.0
    assert read()["Scheduler"].num_running == 1 and controller.full_reads == 3
    now[0] += 30.0  # and the counts are refreshed every full_every_s in any case
    controller.status["Scheduler"] = ("HEALTHY", "")
    controller.replicas["Scheduler"] = ["RUNNING"]
    read()
    read()
    assert controller.full_reads == 4
    now[0] += 30.0
    read()
    assert controller.full_reads == 5
    assert ServeStatusReader("missing", controller)() == {}
