"""The prefix router's index: match lengths, images, the LRU bound, replica removal."""

from __future__ import annotations

from deployments.prefix_index import PrefixIndex, block_keys

B = 16
SYSTEM_A = list(range(1000, 1000 + 4 * B))  # four full blocks
SYSTEM_B = list(range(5000, 5000 + 4 * B))


def test_match_counts_leading_blocks_per_replica():
    index = PrefixIndex(block_size=B)
    index.insert("r1", index.keys(SYSTEM_A + [1] * B))
    index.insert("r2", index.keys(SYSTEM_A[: 2 * B]))
    index.insert("r3", index.keys(SYSTEM_B))
    asked = index.keys(SYSTEM_A + [2] * B)  # same system prompt, another question
    assert index.match(asked) == {"r1": 4, "r2": 2}


def test_a_block_that_differs_ends_the_match_even_if_later_blocks_agree():
    index = PrefixIndex(block_size=B)
    index.insert("r1", index.keys(SYSTEM_A))
    changed = list(SYSTEM_A)
    changed[B] = 7  # second block differs; the chain makes blocks 3 and 4 differ too
    assert index.match(index.keys(changed)) == {"r1": 1}


def test_only_full_blocks_get_keys():
    assert len(block_keys(list(range(B - 1)), B)) == 0
    assert len(block_keys(list(range(2 * B + 5)), B)) == 2
    index = PrefixIndex(block_size=B)
    index.insert("r1", index.keys(SYSTEM_A))
    assert index.match([]) == {}


def test_same_placeholder_tokens_with_other_images_do_not_match():
    index = PrefixIndex(block_size=B)
    index.insert("r1", index.keys(SYSTEM_A, image_hash="cat"))
    assert index.match(index.keys(SYSTEM_A, image_hash="dog")) == {}
    assert index.match(index.keys(SYSTEM_A)) == {}
    assert index.match(index.keys(SYSTEM_A, image_hash="cat")) == {"r1": 4}


def test_each_replica_keeps_at_most_max_blocks_and_forgets_suffixes_first():
    index = PrefixIndex(block_size=B, max_blocks_per_replica=6)
    index.insert("r1", index.keys(SYSTEM_A))
    index.insert("r1", index.keys(SYSTEM_B))  # 8 blocks: the two oldest suffix blocks of A go
    assert index.num_blocks("r1") == 6
    assert index.match(index.keys(SYSTEM_A)) == {"r1": 2}
    assert index.match(index.keys(SYSTEM_B)) == {"r1": 4}


def test_routing_a_prompt_again_makes_it_the_most_recent():
    index = PrefixIndex(block_size=B, max_blocks_per_replica=8)
    index.insert("r1", index.keys(SYSTEM_A))
    index.insert("r1", index.keys(SYSTEM_B))
    index.insert("r1", index.keys(SYSTEM_A))  # A is now newer than B
    index.insert("r1", index.keys([9] * 2 * B))
    assert index.match(index.keys(SYSTEM_A)) == {"r1": 4}
    assert index.match(index.keys(SYSTEM_B)) == {"r1": 2}


def test_removed_replicas_match_nothing_and_leave_no_keys():
    index = PrefixIndex(block_size=B)
    for replica in ("r1", "r2", "r3"):
        index.insert(replica, index.keys(SYSTEM_A))
    index.remove("r1")
    index.retain({"r3"})
    assert index.match(index.keys(SYSTEM_A)) == {"r3": 4}
    assert index.replicas == ["r3"]
    index.remove("r3")
    assert index.match(index.keys(SYSTEM_A)) == {} and not index._holders
