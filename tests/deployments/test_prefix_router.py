"""The prefix router's choice rule, and the router itself over fake replicas: which replica a prompt goes
to, and that it never fails a request."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.messages import GenerateRequest, ImageInputs

import numpy as np
import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.request_router import PendingRequest, ReplicaID

from deployments.messages import ChannelRequest
from deployments.prefix_index import PrefixIndex
from deployments.prefix_router import OwnRequestRouter, PowerOfTwoRouter, PrefixAwareRouter, choose, prompt_of

B = 16
SYSTEM_A = list(range(1000, 1000 + 4 * B))  # four full blocks
SYSTEM_B = list(range(5000, 5000 + 4 * B))


def test_choose_takes_the_longest_match_while_it_is_not_busy():
    queue_lens = {"r1": 5, "r2": 0, "r3": 0}
    assert choose({"r1": 4, "r2": 1}, queue_lens, {}, imbalanced_threshold=8) == ["r1"]


def test_choose_leaves_a_busy_holder_for_the_least_loaded_replica():
    queue_lens = {"r1": 9, "r2": 0, "r3": 0}
    # r2 holds part of the prompt, so of the two idle replicas it is the better one.
    assert choose({"r1": 4, "r2": 1}, queue_lens, {}, imbalanced_threshold=8) == ["r2"]


def test_choose_among_equal_matches_takes_the_least_loaded():
    assert choose({"r1": 4, "r2": 4}, {"r1": 3, "r2": 1}, {}, imbalanced_threshold=8) == ["r2"]


def test_without_a_match_new_prefixes_go_to_the_replica_holding_fewest_blocks():
    queue_lens = {"r1": 0, "r2": 0, "r3": 1}
    assert choose({}, queue_lens, {"r1": 50, "r2": 10, "r3": 0}, imbalanced_threshold=8) == ["r2"]
    # A match below min_match_blocks (a shared template header) counts as none.
    assert choose({"r1": 1}, queue_lens, {"r1": 50, "r2": 10}, 8, min_match_blocks=3) == ["r2"]


def test_choose_ignores_holders_that_cannot_take_a_request():
    assert choose({"r1": 4, "r2": 2}, {"r2": 3, "r3": 0}, {}, imbalanced_threshold=8) == ["r2"]


# The router over fake replicas: what Ray Serve calls, without a Ray cluster.

DEPLOYMENT = DeploymentID(name="Scheduler", app_name="app")


class FakeReplica:
    """What the router reads of Ray's RunningReplica."""

    def __init__(self, unique_id: str, queue_len: int = 0):
        self.replica_id = ReplicaID(unique_id=unique_id, deployment_id=DEPLOYMENT)
        self.queue_len = queue_len
        self.max_ongoing_requests = 64
        self.node_id = "node"
        self.availability_zone = None
        self.multiplexed_model_ids: set[str] = set()

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def pending(method: str, *args: Any) -> PendingRequest:
    metadata = RequestMetadata(request_id="r", internal_request_id="r", call_method=method)
    return PendingRequest(args=list(args), kwargs={}, metadata=metadata)


def generate(tokens: list[int], image_hash: str = "") -> PendingRequest:
    images = ImageInputs(np.zeros(1), image_hash=image_hash) if image_hash else None
    return pending("generate", GenerateRequest("g", tokens, images=images))


def ids(ranked: list[list[FakeReplica]]) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranked]


def run_router(scenario, router_class: type[OwnRequestRouter] = PrefixAwareRouter, **kwargs: Any) -> Any:
    async def main() -> Any:
        router = router_class(  # keywords, as Ray Serve passes them: the mixins take positionals
            deployment_id=DEPLOYMENT,
            handle_source=DeploymentHandleSource.UNKNOWN,
            use_replica_queue_len_cache=False,
        )
        router.initialize_state(**kwargs)
        replicas = [FakeReplica("r1"), FakeReplica("r2")]
        router.update_replicas(replicas)
        return await scenario(router, replicas)

    return asyncio.run(asyncio.wait_for(main(), timeout=10))


def test_router_sends_a_shared_prefix_where_it_went_before_unless_that_replica_is_busy():
    async def scenario(router: PrefixAwareRouter, replicas: list[FakeReplica]) -> Any:
        router.on_request_routed(generate(SYSTEM_A + [1] * B), replicas[1].replica_id, None)
        again = await router.choose_replicas(replicas, generate(SYSTEM_A + [2] * B))
        replicas[1].queue_len = 5
        busy = await router.choose_replicas(replicas, generate(SYSTEM_A + [3] * B))
        return ids(again), ids(busy)

    again, busy = run_router(scenario, imbalanced_threshold=4)
    assert again == [["r2"], ["r1"]]
    assert busy == [["r1"], ["r2"]]


def test_router_spreads_a_burst_of_new_prompts_and_keeps_each_where_it_went():
    async def scenario(router: PrefixAwareRouter, replicas: list[FakeReplica]) -> Any:
        # No on_request_routed between them: all are routed before any replica has answered.
        first = await router.choose_replicas(replicas, generate(SYSTEM_A))
        second = await router.choose_replicas(replicas, generate(SYSTEM_B))
        again = await router.choose_replicas(replicas, generate(SYSTEM_A + [1] * B))
        return ids(first)[0], ids(second)[0], ids(again)[0]

    first, second, again = run_router(scenario)
    assert first != second and again == first


def test_router_forgets_replicas_that_are_gone():
    async def scenario(router: PrefixAwareRouter, replicas: list[FakeReplica]) -> Any:
        router.on_request_routed(generate(SYSTEM_A), replicas[0].replica_id, None)
        router.on_request_routed(generate(SYSTEM_B), replicas[1].replica_id, None)
        router.update_replicas(replicas[1:])
        router.on_replica_actor_died(replicas[1].replica_id)
        return router._index.replicas

    assert run_router(scenario) == []


def test_router_uses_power_of_two_for_calls_without_a_prompt_and_when_the_index_fails():
    class BrokenIndex(PrefixIndex):
        def match(self, keys: list[int]) -> dict[str, int]:
            raise RuntimeError("broken")

    async def scenario(router: PrefixAwareRouter, replicas: list[FakeReplica]) -> Any:
        no_prompt = await router.choose_replicas(replicas, pending("model_info"))
        short = await router.choose_replicas(replicas, generate([1] * (B - 1)))
        router._index = BrokenIndex(B)
        broken = await router.choose_replicas(replicas, generate(SYSTEM_A))
        return no_prompt, short, broken

    for ranked in run_router(scenario):
        assert len(ranked) == 1 and sorted(ids(ranked)[0]) == ["r1", "r2"]


def test_prompt_of_reads_the_generate_request_and_nothing_else():
    async def main() -> tuple[Any, ...]:
        request = GenerateRequest("g", SYSTEM_A)
        return (
            prompt_of(pending("generate", request)),
            prompt_of(pending("stats")),
            prompt_of(pending("generate", "not a request")),
            request,
        )

    found, stats, other, request = asyncio.run(main())
    assert found is request and stats is None and other is None


def test_two_calls_of_one_http_request_are_both_given_a_replica():
    """They share Ray Serve's internal request id (a completions request with two prompts): routed
    through Ray's own loop, each gets its replica and neither waits forever."""

    async def scenario(router: PrefixAwareRouter, replicas: list[FakeReplica]) -> Any:
        first, second = generate(SYSTEM_A), generate(SYSTEM_B)  # both internal_request_id "r"
        chosen = await asyncio.gather(
            router._choose_replica_for_request(first), router._choose_replica_for_request(second)
        )
        return [replica.replica_id.unique_id for replica in chosen]

    chosen = run_router(scenario)
    assert sorted(chosen) == ["r1", "r2"]  # two new prefixes: one on each replica


@pytest.mark.parametrize("router_class", [PrefixAwareRouter, PowerOfTwoRouter])
def test_an_output_channel_goes_to_the_replica_it_names_and_nowhere_else(router_class):
    async def scenario(router: OwnRequestRouter, replicas: list[FakeReplica]) -> Any:
        channel = pending("output_channel", ChannelRequest("c", "r2"))
        named = [await router.choose_replicas(replicas, channel) for _ in range(10)]
        routed = await router._choose_replica_for_request(channel)  # through Ray's own loop
        gone = await router.choose_replicas(replicas[:1], channel)
        return [ids(ranked) for ranked in named], routed.replica_id.unique_id, gone

    named, routed, gone = run_router(scenario, router_class)
    assert named == [[["r2"]]] * 10 and routed == "r2"
    assert gone == []  # away: no other replica stands in (the Ingress gives up after its timeout)
