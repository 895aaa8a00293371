from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager, chain_hash
from engine.core.request import Request
from engine.messages import SamplingParams


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), max_tokens=8)


def _compute(kv: KVCacheManager, request: Request, num: int) -> None:
    assert kv.allocate(request, num)
    request.num_computed_tokens += num
    kv.cache_full_blocks(request)


def test_prefix_match_shares_full_blocks_and_leaves_the_last_token():
    kv = KVCacheManager(BlockPool(16), block_size=4, enable_prefix_caching=True)
    first = _request("a", list(range(10)))
    _compute(kv, first, 10)
    second = _request("b", list(range(10)) + [99, 98])
    match = kv.match_prefix(second)
    assert match.block_ids == first.block_ids[:2]
    exact = _request("c", list(range(8)))
    # Both full blocks are cached, but the last token must be computed: only one block matches.
    assert kv.match_prefix(exact).num_blocks == 1


def test_shared_blocks_are_reference_counted_and_all_return():
    pool = BlockPool(16)
    kv = KVCacheManager(pool, block_size=4, enable_prefix_caching=True)
    first = _request("a", list(range(9)))
    _compute(kv, first, 9)
    second = _request("b", list(range(9)) + [7])
    match = kv.match_prefix(second)
    assert kv.allocate(second, second.num_tokens - 8, match)
    assert pool.ref_count(first.block_ids[0]) == 2
    kv.free(first)
    kv.free(second)
    assert pool.num_free == 16


def test_allocation_counts_revived_cached_blocks_against_free_space():
    pool = BlockPool(3)
    kv = KVCacheManager(pool, block_size=2, enable_prefix_caching=True)
    first = _request("a", [1, 2, 3, 4, 5])
    _compute(kv, first, 5)
    kv.free(first)  # 2 cached full blocks + 1 plain block, all free
    second = _request("b", [1, 2, 3, 4, 9, 9, 9, 9, 9])
    match = kv.match_prefix(second)
    assert match.num_blocks == 2
    # 9 tokens need 5 blocks; 2 come from the cache, 3 would be new: only 1 is left after reviving.
    assert not kv.can_allocate(second, 5, match)
    assert kv.can_allocate(second, 1, match)


def test_disabled_prefix_caching_never_matches():
    kv = KVCacheManager(BlockPool(8), block_size=2, enable_prefix_caching=False)
    first = _request("a", [1, 2, 3, 4, 5])
    _compute(kv, first, 5)
    assert kv.match_prefix(_request("b", [1, 2, 3, 4, 5, 6])).num_blocks == 0


def test_a_new_run_is_placed_with_room_for_the_prompt_and_max_tokens():
    kv = KVCacheManager(BlockPool(40), block_size=4, enable_prefix_caching=False)
    first = _request("a", list(range(4)))
    assert kv.allocate(first, 4) and first.block_ids == [0]
    # 8 prompt tokens + 100 to generate: 27 blocks. The span after the live request holds 39, so the
    # run starts 6 blocks in and both requests grow in place to their full size.
    second = Request("b", list(range(8)), SamplingParams(), max_tokens=100)
    assert kv.allocate(second, 8) and second.block_ids == [7, 8]
    second.num_computed_tokens = 8
    assert kv.allocate(second, 100) and second.block_ids == list(range(7, 34))
    first.num_computed_tokens = 4
    assert kv.allocate(first, 24) and first.block_ids == list(range(7))


def test_block_hashes_are_sha256_over_parent_tokens_and_salt():
    first = chain_hash(None, [1, 2, 3, 4])
    assert len(first) == 32 and first == chain_hash(None, [1, 2, 3, 4])
    # Each input changes the hash: the parent, any token, the salt (images behind image tokens).
    assert chain_hash(first, [5, 6, 7, 8]) != chain_hash(None, [5, 6, 7, 8])
    assert chain_hash(None, [1, 2, 3, 5]) != first
    assert chain_hash(None, [1, 2, 3, 4], b"images:abc") not in (
        first,
        chain_hash(None, [1, 2, 3, 4], b"images:abd"),
    )
    # Token ids are 8 bytes each: ids past 2^32 (no vocabulary has them) still differ from small ones.
    assert chain_hash(None, [2**32]) != chain_hash(None, [0]) != chain_hash(None, [0, 1])
