"""The scheduler with drafted tokens, driven by a fake model that stores tokens in place of K/V: rows
verify drafts, rejected drafts' slots are rolled back and later overwritten, preemption drops drafts,
and the prefix cache never keeps a block holding a rejected draft. The outputs must equal plain decoding."""

import random

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.messages import SamplingParams

import pytest

BLOCK = 4


def next_token(context: list[int]) -> int:
    return hash(tuple(context)) % 97 + 3


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


class FakeModel:
    """Writes each scheduled token into its slot and reads contexts back through the block table."""

    def __init__(self) -> None:
        self.slots: dict[tuple[int, int], int] = {}

    def run(self, item) -> list[int]:
        """The model's token after each new position of the row."""
        request = item.request
        inputs = (request.all_token_ids + request.spec_token_ids)[
            item.start : item.start + item.num_new_tokens
        ]
        for pos, token in zip(range(item.start, item.start + item.num_new_tokens), inputs):
            self.slots[request.block_ids[pos // BLOCK], pos % BLOCK] = token
        first = item.start + item.num_new_tokens - 1 - item.num_spec_tokens
        return [
            next_token([self.slots[request.block_ids[p // BLOCK], p % BLOCK] for p in range(end + 1)])
            for end in range(first, item.start + item.num_new_tokens)
        ]


def draft(request: Request, rng: random.Random, k: int) -> list[int]:
    """Right with probability 0.6 at each position, as long as it stays right."""
    tokens, out = list(request.all_token_ids), []
    for _ in range(k):
        token = next_token(tokens) if rng.random() < 0.6 else 1
        out.append(token)
        tokens.append(token)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_drafted_rows_give_plain_decoding_outputs_under_preemption_and_prefix_sharing(seed):
    rng = random.Random(seed)
    kv = KVCacheManager(BlockPool(12), BLOCK, enable_prefix_caching=True)
    scheduler = Scheduler(kv, max_num_seqs=6, max_num_batched_tokens=rng.choice([8, 16, 64]))
    shared = [rng.randrange(3, 100) for _ in range(9)]
    requests = [
        Request(
            f"r{i}",
            shared + [rng.randrange(3, 100) for _ in range(rng.randrange(1, 8))],
            SamplingParams(),
            12,
        )
        for i in range(8)
    ]
    model = FakeModel()
    pending = list(requests)
    for _ in range(2000):
        if pending and rng.random() < 0.5:
            scheduler.add(pending.pop(0))
        for request in scheduler.running:
            decoding = request.num_computed_tokens == request.num_tokens - 1 >= request.num_prompt_tokens
            room = request.max_tokens - request.num_output_tokens - 1
            if decoding and not request.spec_token_ids and room > 0:
                request.spec_token_ids = draft(request, rng, min(3, room))
        plan = scheduler.schedule()
        outputs = {item.request.request_id: model.run(item) for item in plan.scheduled}
        for item in scheduler.advance(plan):
            request = item.request
            targets = outputs[request.request_id]
            kept = 0
            while kept < item.num_spec_tokens and request.spec_token_ids[kept] == targets[kept]:
                kept += 1
            if item.num_spec_tokens:
                scheduler.settle_drafts(request, kept)
            for token in targets[: kept + 1]:
                scheduler.commit(request, token)
                if request.num_output_tokens == request.max_tokens:
                    scheduler.finish(request)
                    break
        if not pending and not scheduler.has_unfinished():
            break
    for request in requests:
        assert request.output_token_ids == reference(request.prompt_token_ids, 12), request.request_id
    assert scheduler.num_preemptions > 0  # the small pool runs out
    assert kv.prefix_hits > 0  # later requests read the shared prompt's blocks that earlier ones cached
    assert kv.pool.num_free == kv.pool.num_blocks
