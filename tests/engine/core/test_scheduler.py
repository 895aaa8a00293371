"""The scheduler state machine driven by a fake runner that stores tokens in place of K/V.

The fake 'model' reads each context back through the request's block table, so a wrong block
table, a bad prefix share or a lost token after preemption changes the output.
"""

import random

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerPlan
from engine.messages import SamplingParams

import pytest

BLOCK = 4


def next_token(context: list[int]) -> int:
    return hash(tuple(context)) % 97 + 3


class FakeRunner:
    def __init__(self) -> None:
        self.slots: dict[tuple[int, int], int] = {}

    def execute(self, plan: SchedulerPlan, pending: dict[str, int] | None = None) -> dict[str, int]:
        """`pending`: tokens the previous step sampled that the scheduler has not committed yet."""
        sampled = {}
        for item in plan.scheduled:
            request = item.request
            for pos in range(item.start, item.start + item.num_new_tokens):
                block = request.block_ids[pos // BLOCK]
                known = pos < request.num_known_tokens
                token = request.all_token_ids[pos] if known else pending[request.request_id]  # type: ignore[index]
                self.slots[(block, pos % BLOCK)] = token
            if item.needs_sample:
                context = [
                    self.slots[(request.block_ids[p // BLOCK], p % BLOCK)] for p in range(request.num_tokens)
                ]
                sampled[request.request_id] = next_token(context)
        return sampled


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


def run(
    scheduler: Scheduler,
    requests: list[Request],
    arrivals: dict[int, list[Request]],
    abort_at=None,
    pipelined: bool = False,
):
    """Steps to the end. `pipelined` mirrors the engine's asynchronous scheduling: a step's tokens are
    committed only after the next step has been scheduled and run on the still-pending ones."""
    runner, step, added = FakeRunner(), 0, set()
    abort_at = abort_at or {}
    pending: dict[str, int] = {}
    pending_requests: list[Request] = []
    while scheduler.has_unfinished() or arrivals or pending_requests:
        for request in arrivals.pop(step, []):
            scheduler.add(request)
            added.add(request.request_id)
        for request in abort_at.get(step, []):
            if request.request_id in added and not request.is_finished:
                scheduler.finish(request)
        plan = scheduler.schedule()
        whole_alone = len(plan.scheduled) == 1 and plan.scheduled[0].request.prefill_whole
        assert plan.num_batched_tokens <= scheduler.max_num_batched_tokens or whole_alone
        assert len(scheduler.running) <= scheduler.max_num_seqs
        sampled = runner.execute(plan, pending)
        if pipelined:
            launched = [item.request for item in scheduler.advance(plan)]
            for request in pending_requests:
                if not request.is_finished:
                    scheduler.commit(request, pending[request.request_id])
                    _finish_at_length(scheduler, request)
            pending, pending_requests = sampled, launched
        else:
            for request, _ in scheduler.update(plan, sampled):
                _finish_at_length(scheduler, request)
        step += 1
        assert step < 10_000


def _finish_at_length(scheduler: Scheduler, request: Request) -> None:
    assert request.num_output_tokens <= request.max_tokens
    if request.num_output_tokens == request.max_tokens:
        scheduler.finish(request)


@pytest.fixture(params=[False, True], ids=["sync", "pipelined"])
def pipelined(request) -> bool:
    return request.param


def make(num_blocks: int, max_seqs: int = 8, budget: int = 16, caching: bool = True):
    pool = BlockPool(num_blocks)
    return pool, Scheduler(KVCacheManager(pool, BLOCK, caching), max_seqs, budget)


def test_staggered_batch_matches_reference_with_chunked_prefill(pipelined: bool):
    pool, scheduler = make(num_blocks=64)
    rng = random.Random(0)
    requests = [
        Request(f"r{i}", [rng.randrange(100) for _ in range(3 + 5 * i)], SamplingParams(), 12)
        for i in range(8)
    ]
    run(scheduler, requests, {i * 2: [r] for i, r in enumerate(requests)}, pipelined=pipelined)
    for r in requests:
        assert r.output_token_ids == reference(r.prompt_token_ids, 12)
    assert pool.num_free == 64


def test_preemption_recomputes_and_output_is_unchanged(pipelined: bool):
    pool, scheduler = make(num_blocks=12, budget=32)
    requests = [Request(f"r{i}", list(range(i, i + 9)), SamplingParams(), 10) for i in range(6)]
    run(scheduler, requests, {0: list(requests)}, pipelined=pipelined)
    assert scheduler.num_preemptions > 0
    for r in requests:
        assert r.output_token_ids == reference(r.prompt_token_ids, 10)
    assert pool.num_free == 12


def test_whole_prompt_requests_take_the_prompt_in_one_chunk_and_later_tokens_one_by_one(pipelined: bool):
    """Prefix-LM models (PaliGemma): the prompt attends bidirectionally, so it is never split, even over
    the step's budget, and a recompute after preemption adds its outputs one per step."""
    pool, scheduler = make(num_blocks=9, budget=8)
    prompts = [list(range(i, i + n)) for i, n in enumerate((5, 20, 9, 7, 11))]
    requests = [Request(f"w{i}", p, SamplingParams(), 8, prefill_whole=True) for i, p in enumerate(prompts)]
    requests.append(Request("chunked", list(range(50, 69)), SamplingParams(), 8))
    chunks: list[tuple[Request, int, int]] = []
    schedule = scheduler.schedule

    def recording() -> SchedulerPlan:
        plan = schedule()
        chunks.extend((s.request, s.start, s.num_new_tokens) for s in plan.scheduled)
        return plan

    scheduler.schedule = recording  # type: ignore[method-assign]
    run(scheduler, requests, {0: requests[:3], 2: requests[3:]}, pipelined=pipelined)
    assert scheduler.num_preemptions > 0
    for request, start, num_new in chunks:
        if request.prefill_whole and start < request.num_prompt_tokens:
            assert (start, num_new) == (0, request.num_prompt_tokens)
        elif request.prefill_whole:
            assert num_new == 1
    assert any(r.request_id == "chunked" and 0 < n < 19 for r, _, n in chunks)  # others still chunk
    for r in requests:
        assert r.output_token_ids == reference(r.prompt_token_ids, 8)
    assert pool.num_free == 9


def test_prefix_hits_share_blocks_and_skip_compute(pipelined: bool):
    pool, scheduler = make(num_blocks=64)
    shared = list(range(20))
    first = Request("a", shared + [1], SamplingParams(), 4)
    second = Request("b", shared + [2, 3], SamplingParams(), 4)
    run(scheduler, [first, second], {0: [first], 8: [second]}, pipelined=pipelined)
    assert second.num_cached_tokens == 20
    assert scheduler.kv.prefix_hits >= 20
    assert second.output_token_ids == reference(second.prompt_token_ids, 4)
    assert pool.num_free == 64


def test_random_mix_of_finished_cancelled_and_preempted_returns_every_block(pipelined: bool):
    for seed in range(20):
        rng = random.Random(seed)
        pool, scheduler = make(
            num_blocks=rng.randrange(10, 30), max_seqs=rng.randrange(1, 8), budget=rng.randrange(4, 40)
        )
        prefix = [rng.randrange(50) for _ in range(rng.randrange(0, 12))]
        requests = [
            Request(
                f"r{i}",
                prefix + [rng.randrange(50) for _ in range(rng.randrange(1, 14))],
                SamplingParams(),
                rng.randrange(1, 12),
            )
            for i in range(12)
        ]
        arrivals: dict[int, list[Request]] = {}
        for r in requests:
            arrivals.setdefault(rng.randrange(0, 20), []).append(r)
        aborts: dict[int, list[Request]] = {}
        for r in rng.sample(requests, 3):
            aborts.setdefault(rng.randrange(0, 40), []).append(r)
        run(scheduler, requests, arrivals, aborts, pipelined=pipelined)
        assert pool.num_free == pool.num_blocks, f"seed {seed} leaked blocks"
        aborted = {r.request_id for group in aborts.values() for r in group}
        for r in requests:
            if r.request_id not in aborted:
                assert r.output_token_ids == reference(r.prompt_token_ids, r.max_tokens), f"seed {seed}"
