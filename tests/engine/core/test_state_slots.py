"""State slots of models with recurrent layers: one per request that holds blocks, handed back when it
finishes or is preempted, and a request without a free slot waits (allocate says no)."""

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.state_slots import StateSlots
from engine.messages import SamplingParams

import pytest


def _request(rid: str) -> Request:
    return Request(rid, list(range(6)), SamplingParams(), max_tokens=4)


def test_a_request_holds_one_slot_while_it_holds_blocks_and_gives_it_back():
    slots = StateSlots(2)
    kv = KVCacheManager(BlockPool(16), block_size=4, enable_prefix_caching=False, slots=slots)
    first, second, third = _request("a"), _request("b"), _request("c")
    assert kv.allocate(first, 6) and kv.allocate(second, 6)
    assert {first.state_slot, second.state_slot} == {0, 1}
    assert kv.allocate(first, 1)  # growing keeps the slot it has
    assert not kv.allocate(third, 6)  # blocks are free, slots are not
    assert third.state_slot is None and not third.block_ids
    kv.free(first)  # finish, abort or preemption
    assert first.state_slot is None and slots.num_free == 1
    assert kv.allocate(third, 6) and third.state_slot is not None


def test_recurrent_state_and_the_prefix_cache_do_not_mix():
    with pytest.raises(AssertionError):
        KVCacheManager(BlockPool(4), block_size=4, enable_prefix_caching=True, slots=StateSlots(1))
