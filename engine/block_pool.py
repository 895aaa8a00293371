"""Owns KV block bookkeeping: reference counts, the free queue and the prefix-hash index.

Never touches tensors and never sees requests: callers (only the KV cache manager) pass block ids.

Free queue order is eviction order. Blocks that hold no cached prefix go to the front (reused
first); cached blocks whose last user left go to the back, so the least recently used cached
block is evicted first. A cached block stays findable by its hash until it is evicted.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    def __init__(self, num_blocks: int):
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self._ref_cnt = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._by_hash: dict[int, int] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now, evictable cached blocks included."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def ref_count(self, block_id: int) -> int:
        return self._ref_cnt[block_id]

    def is_free(self, block_id: int) -> bool:
        return block_id in self._free

    def allocate(self, num: int) -> list[int]:
        assert num <= len(self._free), "caller must check num_free first"
        block_ids = []
        for _ in range(num):
            block_id, _ = self._free.popitem(last=False)
            self._evict(block_id)
            self._ref_cnt[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def touch(self, block_ids: list[int]) -> None:
        """Takes a reference on cached blocks found by `lookup`, pulling them off the free queue."""
        for block_id in block_ids:
            if self._ref_cnt[block_id] == 0:
                del self._free[block_id]
            self._ref_cnt[block_id] += 1

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference on each block; pass a request's blocks tail first."""
        for block_id in block_ids:
            assert self._ref_cnt[block_id] > 0, f"block {block_id} freed twice"
            self._ref_cnt[block_id] -= 1
            if self._ref_cnt[block_id] == 0:
                self._free[block_id] = None
                if self._hash_of[block_id] is None:
                    self._free.move_to_end(block_id, last=False)

    def lookup(self, block_hash: int) -> int | None:
        return self._by_hash.get(block_hash)

    def cache(self, block_id: int, block_hash: int) -> None:
        """Registers a full, computed block under its prefix hash (first writer wins)."""
        assert self._ref_cnt[block_id] > 0
        if self._hash_of[block_id] is not None or block_hash in self._by_hash:
            return
        self._hash_of[block_id] = block_hash
        self._by_hash[block_hash] = block_id

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of[block_id]
        if block_hash is not None:
            del self._by_hash[block_hash]
            self._hash_of[block_id] = None
            self.num_evictions += 1
