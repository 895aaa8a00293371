from engine.block_pool import BlockPool


def test_allocate_and_free_return_every_block():
    pool = BlockPool(8)
    a = pool.allocate(5)
    assert pool.num_free == 3 and len(set(a)) == 5
    pool.free(list(reversed(a)))
    assert pool.num_free == 8 and pool.num_used == 0


def test_uncached_blocks_are_reused_before_cached_ones():
    pool = BlockPool(4)
    cached, plain = pool.allocate(2)
    pool.cache(cached, block_hash=123)
    pool.free([cached, plain])
    assert pool.allocate(1) == [plain]  # the cached block survives
    assert pool.lookup(123) == cached


def test_cached_blocks_are_evicted_least_recently_used():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, 1)
    pool.cache(b, 2)
    pool.free([a])
    pool.free([b])
    assert pool.allocate(1) == [a]  # a was released first
    assert pool.lookup(1) is None and pool.lookup(2) == b
    assert pool.num_evictions == 1


def test_touch_revives_a_free_cached_block_and_counts_references():
    pool = BlockPool(3)
    (a,) = pool.allocate(1)
    pool.cache(a, 7)
    pool.free([a])
    assert pool.is_free(a)
    pool.touch([a])
    pool.touch([a])
    assert not pool.is_free(a) and pool.ref_count(a) == 2
    pool.free([a])
    assert not pool.is_free(a)
    pool.free([a])
    assert pool.is_free(a) and pool.lookup(7) == a


def test_first_writer_wins_for_a_hash():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, 5)
    pool.cache(b, 5)
    assert pool.lookup(5) == a
    pool.free([b])
    assert pool.allocate(1) == [b] and pool.lookup(5) == a
