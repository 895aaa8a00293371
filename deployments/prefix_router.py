"""Routes each `generate` call to the Scheduler replica whose prefix cache most likely holds its prompt.

Owns the routing policy and its PrefixIndex (deployments/prefix_index.py); it runs inside every
process that holds a Scheduler handle (the Ingress), so each keeps its own index. It never changes a
request and never fails one: any error in the prefix logic falls back to power of two choices.

    prompt -> block keys -> index.match -> longest-match replicas -> least loaded of them,
    unless it has more than `imbalanced_threshold` requests over the least loaded replica;
    no match -> least loaded (ties: fewest indexed blocks, so new prefixes spread);
    the prompt's blocks go into the index for the chosen replica at once, and again for the replica
    that accepted it (`on_request_routed`).

Both routers here send an `output_channel` call to the one replica it names (deployments/inbox.py),
and nowhere else while that replica is away.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any

from engine.messages import GenerateRequest

from ray.serve.request_router import LocalityMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from deployments.messages import ChannelRequest
from deployments.prefix_index import PrefixIndex

logger = logging.getLogger("ray.serve")  # the Ingress replica's log file and the dashboard


def choose(
    matches: dict[str, int],
    queue_lens: dict[str, int],
    num_blocks: dict[str, int],
    imbalanced_threshold: int,
    min_match_blocks: int = 1,
) -> list[str]:
    """The replicas tied for best, among those in `queue_lens` (the ones that can take a request).

    `matches`: replica -> leading blocks of the prompt it holds; `num_blocks`: replica -> blocks it
    holds in all. The longest match wins unless its least loaded holder is busy (more than
    `imbalanced_threshold` over the least loaded replica); then, or with no match of at least
    `min_match_blocks`, the least loaded replicas, preferring a longer match, then fewer blocks."""
    assert queue_lens, "no replica to choose from"
    matches = {r: n for r, n in matches.items() if r in queue_lens}
    least = min(queue_lens.values())
    best = max(matches.values(), default=0)
    if best < min_match_blocks:
        matches = {}  # a header every prompt shares must not pull new prefixes to one replica
    else:
        holders = [r for r, n in matches.items() if n == best]
        low = min(queue_lens[r] for r in holders)
        if low - least <= imbalanced_threshold:
            return [r for r in holders if queue_lens[r] == low]
    idle = [r for r, q in queue_lens.items() if q == least]
    rank = {r: (-matches.get(r, 0), num_blocks.get(r, 0)) for r in idle}
    top = min(rank.values())
    return [r for r in idle if rank[r] == top]


def prompt_of(pending_request: PendingRequest | None) -> GenerateRequest | None:
    """The GenerateRequest of a `generate` call; None for calls with no prompt (model_info, stats)."""
    if pending_request is None or pending_request.metadata.call_method != "generate":
        return None
    for arg in [*pending_request.args, *pending_request.kwargs.values()]:
        if isinstance(arg, GenerateRequest):
            return arg
    return None


def channel_target(pending_request: PendingRequest | None) -> str | None:
    """The replica an `output_channel` call must reach; None for every other call."""
    if pending_request is None or pending_request.metadata.call_method != "output_channel":
        return None
    for arg in [*pending_request.args, *pending_request.kwargs.values()]:
        if isinstance(arg, ChannelRequest):
            return arg.replica_id
    return None


class OwnRequestRouter(LocalityMixin, RequestRouter):
    """Gives each routing task's choice to the request it chose for, and routes output channels.

    No FIFOMixin: with it, a routing task hands its chosen replica to whichever request is first in
    line, which would send another prompt to the replica picked for this one's prefix, or an output
    channel to a replica it does not name."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        target = channel_target(pending_request)
        if target is not None:  # none while it is away: the Ingress gives up after its open timeout
            return [[r] for r in candidate_replicas if r.replica_id.unique_id == target]
        # Also sets the request's `should_backoff`: without it a retry when every replica is full
        # would spin without sleeping.
        allowed = self.apply_locality_routing(pending_request)
        candidates = [r for r in candidate_replicas if r.replica_id in allowed]
        if not candidates:
            return []
        return await self.rank(candidates, pending_request)

    async def rank(
        self, candidates: list[RunningReplica], pending_request: PendingRequest | None
    ) -> list[list[RunningReplica]]:
        """Power of two choices: Ray Serve probes both and takes the less loaded."""
        return [random.sample(candidates, min(2, len(candidates)))]

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata: Any = None) -> None:
        """Gives the replica to the request this routing task chose it for. Ray Serve's own rule finds
        that request by its internal request id, which every handle call made while serving one HTTP
        request shares: a completions request with two prompts makes two `generate` calls, and the
        second was never given a replica (its routing task chose again forever)."""
        own = self._own_pending_request()
        if own is None:
            super()._fulfill_next_pending_request(replica, request_metadata)
            return
        self._record_queue_wait_time(own)
        own.future.set_result(replica)
        self._remove_pending_request_from_indices(own)

    def _own_pending_request(self) -> PendingRequest | None:
        task = asyncio.current_task()
        futures = [f for f, t in self._routing_task_by_pending_request_future.items() if t is task]
        return next(
            (p for p in self._pending_requests_to_fulfill if p.future in futures and not p.future.done()),
            None,
        )


class PowerOfTwoRouter(OwnRequestRouter):
    """`request_router: power_of_two`: Ray Serve's default choice, plus output channels."""


class PrefixAwareRouter(OwnRequestRouter):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.initialize_state()
        self._warned = False

    def initialize_state(
        self,
        imbalanced_threshold: int = 16,
        block_size: int = 16,
        max_blocks_per_replica: int = 4096,
        min_match_fraction: float = 0.1,
    ) -> None:
        """Ray Serve calls this with `request_router_config.request_router_kwargs`.

        imbalanced_threshold: open requests a prefix holder may have over the least loaded replica
            before the request goes to the least loaded one instead. 16, a quarter of the engine's
            default batch (max_num_seqs 64), is a judgement, not a measurement: a few more rows in a
            batch cost less than recomputing a long prefix.
        block_size: tokens per indexed block; the engine's `block_size` keys its cache the same way
            (another value still routes equal prefixes together, at a coarser or finer grain).
        max_blocks_per_replica: keys remembered per replica (LRU, ~370 bytes each): 4096 is a few
            times the ~1,700 blocks of the default engine cache for the bundled model on a 24 GiB
            machine; an entry the engine has evicted only costs a missed hit.
        min_match_fraction: a match shorter than this fraction of the prompt's blocks counts as
            none, so a short shared header (a chat template's) does not pin every prompt to one replica.
        """
        self._index = PrefixIndex(block_size, max_blocks_per_replica)
        self._imbalanced_threshold = imbalanced_threshold
        self._min_match_fraction = min_match_fraction

    async def rank(
        self, candidates: list[RunningReplica], pending_request: PendingRequest | None
    ) -> list[list[RunningReplica]]:
        request = prompt_of(pending_request)
        if request is not None:
            try:
                ranked = await self._rank_by_prefix(candidates, request)
                if ranked:
                    return ranked
            except Exception:  # noqa: BLE001  (logged once; routing must never fail a request)
                self._warn_once("prefix-aware routing failed; using power of two choices")
        return await super().rank(candidates, pending_request)

    async def _rank_by_prefix(
        self, candidates: list[RunningReplica], request: GenerateRequest
    ) -> list[list[RunningReplica]] | None:
        """[[the chosen replica], [the others]]: Ray tries the second rank if the first is full.
        None for a prompt shorter than one block or when no replica reports room."""
        keys = self._index.keys(request.prompt_token_ids, _image_hash(request))
        if not keys:
            return None
        queue_lens = await self._queue_lens(candidates)
        if not queue_lens:
            return None
        num_blocks = {r: self._index.num_blocks(r) for r in queue_lens}
        min_blocks = max(1, math.ceil(self._min_match_fraction * len(keys)))
        best = choose(self._index.match(keys), queue_lens, num_blocks, self._imbalanced_threshold, min_blocks)
        chosen_id = random.choice(best)
        # Recorded now, not only once the replica accepts: requests routed meanwhile (each awaits queue
        # lengths) must see it, or a burst of new prompts all lands on the replica with fewest blocks.
        self._index.insert(chosen_id, keys)
        chosen = next(r for r in candidates if r.replica_id.unique_id == chosen_id)
        others = [r for r in candidates if r is not chosen]
        return [[chosen], others] if others else [[chosen]]

    async def _queue_lens(self, candidates: list[RunningReplica]) -> dict[str, int]:
        """Open requests of each candidate with room for one more: Ray's cache (updated on every send
        and every replica reply), else a probe, as Ray's own routers read it."""
        known: dict[str, int] = {}
        unknown: list[RunningReplica] = []
        for replica in candidates:
            queue_len = self._cached_queue_len(replica)
            if queue_len is None:
                unknown.append(replica)
            else:
                known[replica.replica_id.unique_id] = queue_len
        if unknown:
            for replica, queue_len in await self._probe_queue_lens(unknown, 0):
                if queue_len is not None and queue_len < replica.max_ongoing_requests:
                    known[replica.replica_id.unique_id] = queue_len
        return known

    def _cached_queue_len(self, replica: RunningReplica) -> int | None:
        """None when absent, stale or full: a full replica is probed again rather than trusted."""
        if not self._use_replica_queue_len_cache:
            return None
        queue_len: int | None = self.replica_queue_len_cache.get(replica.replica_id)
        if queue_len is None or queue_len >= replica.max_ongoing_requests:
            return None
        return queue_len

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """Called once a replica has accepted the request: the one chosen, or another if that was full.
        (A replica that rejected keeps the entry made at choice time until its LRU drops it.)"""
        request = prompt_of(pending_request)
        if request is None:
            return
        try:
            keys = self._index.keys(request.prompt_token_ids, _image_hash(request))
            self._index.insert(replica_id.unique_id, keys)
        except Exception:  # noqa: BLE001  (logged once; routing must never fail a request)
            self._warn_once("recording a routed prompt in the prefix index failed")

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        try:
            self._index.retain({r.replica_id.unique_id for r in replicas})
        except Exception:  # noqa: BLE001  (logged once; routing must never fail a request)
            self._warn_once("forgetting removed replicas in the prefix index failed")

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        try:
            self._index.remove(replica_id.unique_id)
        except Exception:  # noqa: BLE001  (logged once; routing must never fail a request)
            self._warn_once("forgetting a dead replica in the prefix index failed")

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            logger.exception(message)


def _image_hash(request: GenerateRequest) -> str:
    return request.images.image_hash if request.images is not None else ""
