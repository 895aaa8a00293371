"""Owns KV block bookkeeping: reference counts, the free queue and the prefix-hash index.

Never touches tensors and never sees requests: callers (only the KV cache manager) pass block ids.

Free queue order is eviction order. Blocks that hold no cached prefix go to the front (reused
first); cached blocks whose last user left go to the back, so the least recently used cached
block is evicted first. A cached block stays findable by its hash until it is evicted.

Placement keeps a request's blocks in runs of consecutive ids where it can, so that decode
attention reads each run in place (engine/runner/cpu/window_attention.py), without evicting a cached prefix
the free queue would have kept:

    growth     the blocks right after the request's last one, as many as hold no cached prefix,
               else as many as are free and hold none or one in the older half of the eviction order
    new run    in the longest span of free blocks that hold no cached prefix, else of those and the
               cached ones in the older half of the eviction order: at the span's start when nothing
               before it can grow into it (pool start, free or cached block), else where the run has
               room to reach its expected size and the request before it keeps half the rest
    otherwise  the free queue's order, as ever
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int):
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self._ref_cnt = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._by_hash: dict[bytes, int] = {}
        self.num_evictions = 0
        self._is_free = np.ones(num_blocks, dtype=bool)
        self._is_cached = np.zeros(num_blocks, dtype=bool)
        self._freed_at = np.zeros(num_blocks, dtype=np.int64)  # release order, for the cold test
        self._clock = 0

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

    def allocate(self, num: int, after: int | None = None, want: int | None = None) -> list[int]:
        """`num` blocks, continuing the run that ends at block `after` where possible. `want`: the
        blocks the run is expected to reach (its request's prompt and max_tokens), so that a new run
        starts where it has room to grow that far."""
        assert num <= len(self._free), "caller must check num_free first"
        plain = self._is_free & ~self._is_cached
        block_ids = self._grow(after, num, plain) if after is not None else []
        old = None
        if after is not None and len(block_ids) < num:
            old = self._old_cached()
            block_ids = self._grow(after, num, plain | old)
        if len(block_ids) < num:
            plain[block_ids] = False
            rest = num - len(block_ids)
            old = self._old_cached() if old is None else old
            old[block_ids] = False
            room = max(rest, (want or num) - len(block_ids))
            block_ids += self._place(rest, room, plain) or self._place(rest, room, plain | old)
        for block_id in block_ids:
            del self._free[block_id]
        while len(block_ids) < num:
            block_id, _ = self._free.popitem(last=False)
            block_ids.append(block_id)
        for block_id in block_ids:
            self._evict(block_id)
            self._ref_cnt[block_id] = 1
            self._is_free[block_id] = False
        return block_ids

    def _old_cached(self) -> np.ndarray:
        """Free cached blocks in the older half of the eviction order."""
        cached = self._is_free & self._is_cached
        if not cached.any():
            return cached
        return cached & (self._freed_at < np.median(self._freed_at[cached]))

    def _grow(self, after: int, num: int, usable: np.ndarray) -> list[int]:
        ahead = usable[after + 1 : after + 1 + num]
        count = len(ahead) if ahead.all() else int(np.argmin(ahead))
        return list(range(after + 1, after + 1 + count))

    def _place(self, num: int, room: int, usable: np.ndarray) -> list[int]:
        edges = np.diff(np.concatenate(([0], usable.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if not len(starts):
            return []
        longest = int(np.argmax(ends - starts))
        first, end = int(starts[longest]), int(ends[longest])
        if end - first < num:
            return []
        if first > 0 and self._ref_cnt[first - 1] > 0:  # a live request may grow into the span
            # Room for this run to reach `room` blocks, the rest split with the request before it.
            slack = end - first - room if end - first >= room else end - first - num
            first += slack // 2
        return list(range(first, first + num))

    def touch(self, block_ids: list[int]) -> None:
        """Takes a reference on cached blocks found by `lookup`, pulling them off the free queue."""
        for block_id in block_ids:
            if self._ref_cnt[block_id] == 0:
                del self._free[block_id]
                self._is_free[block_id] = False
            self._ref_cnt[block_id] += 1

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference on each block; pass a request's blocks tail first."""
        for block_id in block_ids:
            assert self._ref_cnt[block_id] > 0, f"block {block_id} freed twice"
            self._ref_cnt[block_id] -= 1
            if self._ref_cnt[block_id] == 0:
                self._free[block_id] = None
                self._is_free[block_id] = True
                self._clock += 1
                self._freed_at[block_id] = self._clock
                if self._hash_of[block_id] is None:
                    self._free.move_to_end(block_id, last=False)

    def lookup(self, block_hash: bytes) -> int | None:
        return self._by_hash.get(block_hash)

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Registers a full, computed block under its prefix hash (first writer wins)."""
        assert self._ref_cnt[block_id] > 0
        if self._hash_of[block_id] is not None or block_hash in self._by_hash:
            return
        self._hash_of[block_id] = block_hash
        self._by_hash[block_hash] = block_id
        self._is_cached[block_id] = True

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of[block_id]
        if block_hash is not None:
            del self._by_hash[block_hash]
            self._hash_of[block_id] = None
            self._is_cached[block_id] = False
            self.num_evictions += 1
