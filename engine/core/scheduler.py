"""The scheduler state machine: `schedule() -> plan` and `update(plan, sampled) -> tokens`.

Owns the waiting queue and the running list; calls the KV cache manager (never the pool, never
the model). Each step hands out `num_tokens - num_computed_tokens` per request under a token
budget: the same rule covers prefill, chunked prefill, prefix hits, recompute and decode.
`update` is `advance` (when a step is launched) plus `commit` (when its tokens are read); the engine
calls the two apart when a step's tokens stay on the device while the next step is scheduled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.kv_cache_manager import NO_MATCH, KVCacheManager
from engine.core.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    start: int  # num_computed_tokens when scheduled
    num_new_tokens: int
    num_spec_tokens: int = 0  # of the new tokens, drafted ones to verify (the last ones)

    @property
    def needs_sample(self) -> bool:
        """True when this chunk reaches the request's last token, so its logits give a new token."""
        return self.start + self.num_new_tokens == self.request.num_tokens + self.num_spec_tokens


@dataclass
class SchedulerPlan:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerPlan:
        plan = SchedulerPlan()
        budget = self._schedule_running(plan, self.max_num_batched_tokens)
        if not plan.preempted:
            self._schedule_waiting(plan, budget)
        return plan

    def _schedule_running(self, plan: SchedulerPlan, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if self._finishes_by_length(request):
                i += 1  # its pending token is its last: computing another would be wasted
                continue
            num_new = self._num_new(request, budget, plan)
            if num_new == 0:
                i += 1
                continue
            num_spec = self._num_spec(request, num_new, budget)
            num_new += num_spec
            while not self.kv.allocate(request, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is request:
                    break
            else:
                plan.scheduled.append(
                    ScheduledRequest(request, request.num_computed_tokens, num_new, num_spec)
                )
                budget -= num_new
                i += 1
        return budget

    @staticmethod
    def _num_spec(request: Request, num_new: int, budget: int) -> int:
        """Drafted tokens verified with a decode row, within what is left of the budget after it (the
        drafts beyond are dropped: a later step drafts again)."""
        if not request.spec_token_ids or num_new != 1 or request.num_pending_tokens:
            return 0
        del request.spec_token_ids[budget - 1 :]
        return len(request.spec_token_ids)

    def _schedule_waiting(self, plan: SchedulerPlan, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            assert not request.num_pending_tokens, "a pending token is committed before readmission"
            match = self.kv.match_prefix(request) if not request.block_ids else NO_MATCH
            num_matched = match.num_blocks * self.kv.block_size
            num_new = self._num_new(request, budget, plan, num_matched)
            if num_new == 0 or not self.kv.allocate(request, num_new, match):
                break
            self.waiting.popleft()
            if request.num_preemptions == 0 and request.num_computed_tokens == 0:
                request.num_cached_tokens = num_matched
            request.num_computed_tokens += num_matched
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.scheduled.append(ScheduledRequest(request, request.num_computed_tokens, num_new))
            budget -= num_new

    @staticmethod
    def _num_new(request: Request, budget: int, plan: SchedulerPlan, num_matched: int = 0) -> int:
        """Tokens to compute this step: what is left, within the budget. A whole-prompt request takes
        its prompt in one chunk (over the budget when the step holds nothing else; else it waits, 0) and
        later tokens one at a time."""
        num_computed = request.num_computed_tokens + num_matched
        left = request.num_tokens - num_computed
        if not request.prefill_whole:
            return min(left, budget)
        if num_computed >= request.num_prompt_tokens:
            return min(left, 1)
        prompt_left = request.num_prompt_tokens - num_computed
        return prompt_left if prompt_left <= budget or plan.is_empty else 0

    def _preempt(self, request: Request) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, go back to the queue's front."""
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids.clear()
        request.draft_frontier = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    @staticmethod
    def _finishes_by_length(request: Request) -> bool:
        num_pending = request.num_pending_tokens
        return num_pending > 0 and request.num_output_tokens + num_pending >= request.max_tokens

    def update(self, plan: SchedulerPlan, sampled: dict[str, int]) -> list[tuple[Request, int]]:
        """Advances computed counts, appends sampled tokens; returns (request, new token) pairs."""
        new_tokens = []
        for item in self.advance(plan):
            token_id = sampled[item.request.request_id]
            self.commit(item.request, token_id)
            new_tokens.append((item.request, token_id))
        return new_tokens

    def advance(self, plan: SchedulerPlan) -> list[ScheduledRequest]:
        """The plan's step is launched: its tokens have KV now and each sampling item owes one
        pending token. Returns the sampling items of live requests."""
        sampling = []
        for item in plan.scheduled:
            request = item.request
            if request.is_finished:  # aborted while the step was built
                continue
            request.num_computed_tokens += item.num_new_tokens
            if item.needs_sample:
                request.num_pending_tokens += 1
                sampling.append(item)
            self.kv.cache_full_blocks(request)
        return sampling

    def settle_drafts(self, request: Request, num_accepted: int) -> None:
        """A verified row: the rejected drafts' KV no longer counts (the next steps overwrite it); the
        accepted drafts join the step's sampled token as pending tokens, committed one by one."""
        num_rejected = len(request.spec_token_ids) - num_accepted
        assert num_rejected >= 0 and request.num_pending_tokens > 0
        request.num_computed_tokens -= num_rejected
        request.num_pending_tokens += num_accepted
        request.spec_token_ids.clear()

    def commit(self, request: Request, token_id: int) -> None:
        """A pending token's value is known: it joins the request's tokens."""
        assert request.num_pending_tokens > 0
        request.num_pending_tokens -= 1
        request.append_token(token_id)
        self.kv.cache_full_blocks(request)

    def finish(self, request: Request) -> None:
        """Removes a finished or aborted request and frees its blocks at once."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.kv.free(request)
