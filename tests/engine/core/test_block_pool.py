from engine.core.block_pool import BlockPool


def key(n: int) -> bytes:
    """A stand-in block hash (the KV manager's are SHA-256 digests)."""
    return n.to_bytes(32, "little")


def test_allocate_and_free_return_every_block():
    pool = BlockPool(8)
    a = pool.allocate(5)
    assert pool.num_free == 3 and len(set(a)) == 5
    pool.free(list(reversed(a)))
    assert pool.num_free == 8 and pool.num_used == 0


def test_uncached_blocks_are_reused_before_cached_ones():
    pool = BlockPool(4)
    cached, plain = pool.allocate(2)
    pool.cache(cached, block_hash=key(123))
    pool.free([cached, plain])
    assert pool.allocate(1) == [plain]  # the cached block survives
    assert pool.lookup(key(123)) == cached


def test_cached_blocks_are_evicted_least_recently_used():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, key(1))
    pool.cache(b, key(2))
    pool.free([a])
    pool.free([b])
    assert pool.allocate(1) == [a]  # a was released first
    assert pool.lookup(key(1)) is None and pool.lookup(key(2)) == b
    assert pool.num_evictions == 1


def test_touch_revives_a_free_cached_block_and_counts_references():
    pool = BlockPool(3)
    (a,) = pool.allocate(1)
    pool.cache(a, key(7))
    pool.free([a])
    assert pool.is_free(a)
    pool.touch([a])
    pool.touch([a])
    assert not pool.is_free(a) and pool.ref_count(a) == 2
    pool.free([a])
    assert not pool.is_free(a)
    pool.free([a])
    assert pool.is_free(a) and pool.lookup(key(7)) == a


def test_first_writer_wins_for_a_hash():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, key(5))
    pool.cache(b, key(5))
    assert pool.lookup(key(5)) == a
    pool.free([b])
    assert pool.allocate(1) == [b] and pool.lookup(key(5)) == a


def test_a_request_grows_in_place_and_new_runs_leave_room_to_grow():
    pool = BlockPool(40)
    first = pool.allocate(4)
    assert first == [0, 1, 2, 3]  # nothing before the pool's start grows
    second = pool.allocate(4)
    assert second == list(range(20, 24))  # in the middle of the span after a live request
    assert pool.allocate(2, after=first[-1]) == [4, 5]
    assert pool.allocate(3, after=second[-1]) == [24, 25, 26]


def test_growth_that_meets_a_used_block_continues_elsewhere():
    pool = BlockPool(10)
    a = pool.allocate(2)
    b = pool.allocate(2)
    grown = pool.allocate(4, after=a[-1])
    assert grown[:1] == [a[-1] + 1] and not set(grown) & set(b) and len(set(grown)) == 4


def test_placement_keeps_recently_freed_cached_blocks():
    pool = BlockPool(6)
    old = pool.allocate(3)
    recent = pool.allocate(3)
    for i, block in enumerate(old + recent):
        pool.cache(block, key(100 + i))
    pool.free(old)
    pool.free(recent)
    run = pool.allocate(2)
    assert set(run) <= set(old) and all(pool.lookup(key(100 + 3 + i)) == b for i, b in enumerate(recent))


def test_growth_continues_into_cached_blocks_freed_long_ago_but_keeps_recent_ones():
    pool = BlockPool(8)
    for block in pool.allocate(8):
        pool.cache(block, key(100 + block))
    pool.free([3, 2])  # freed first: the older half of the eviction order
    pool.free([7, 6])
    assert pool.allocate(2, after=1) == [2, 3]
    assert pool.allocate(1, after=5) == [7]  # block 6 was freed last: its prefix stays cached
    assert pool.lookup(key(106)) == 6


def test_a_new_run_after_a_live_request_leaves_itself_room_to_reach_its_expected_size():
    pool = BlockPool(40)
    assert pool.allocate(4) == [0, 1, 2, 3]
    # The span after the live request is 36 blocks: 30 for the new run, the other 6 split evenly.
    assert pool.allocate(4, want=30) == list(range(7, 11))
