"""Which Scheduler replica holds which prompt prefixes, in whole KV blocks: the prefix router's memory.

Owns the block-key chains and a bounded LRU of keys per replica. Pure logic: no Ray, no MLX; it
never sees a replica's real cache, only what the router sent there, so it is a guess that ages out.

    key[0] = hash(image_hash, tokens[0:B])        B = block_size; only full blocks get a key
    key[i] = hash(key[i-1], tokens[i*B:(i+1)*B])  so equal keys mean equal prefixes (up to collisions)
"""

from __future__ import annotations

from collections import OrderedDict

BlockKey = int


def block_keys(token_ids: list[int], block_size: int, image_hash: str = "") -> list[BlockKey]:
    """One key per full block. Python's 64-bit `hash()`, not the engine's SHA-256: a collision here
    only sends a request to a replica that lacks the prefix, it never hands out another prompt's KV."""
    keys: list[BlockKey] = []
    parent: BlockKey | str = image_hash  # the images behind the placeholder tokens key the whole chain
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


class PrefixIndex:
    """Per replica, the block keys of prompts routed to it, least recently routed first.

    `insert` records a prompt's blocks for a replica; `match` says how many leading blocks each
    replica holds; `remove` forgets a replica. Each replica keeps at most `max_blocks_per_replica`
    keys, so memory stays bounded however long the server runs.
    """

    def __init__(self, block_size: int = 16, max_blocks_per_replica: int = 8192):
        assert block_size >= 1 and max_blocks_per_replica >= 1
        self.block_size = block_size
        self.max_blocks_per_replica = max_blocks_per_replica
        self._lru: dict[str, OrderedDict[BlockKey, None]] = {}
        self._holders: dict[BlockKey, set[str]] = {}  # the reverse map, so `match` walks one chain

    def keys(self, token_ids: list[int], image_hash: str = "") -> list[BlockKey]:
        return block_keys(token_ids, self.block_size, image_hash)

    def match(self, keys: list[BlockKey]) -> dict[str, int]:
        """Replica -> number of leading blocks of `keys` it holds; replicas holding none are absent."""
        matched: dict[str, int] = {}
        alive = set(self._holders.get(keys[0], ())) if keys else set()
        for depth, key in enumerate(keys):
            holders = self._holders.get(key, set())
            for replica in alive - holders:
                matched[replica] = depth
            alive &= holders
            if not alive:
                break
        for replica in alive:
            matched[replica] = len(keys)
        return matched

    def insert(self, replica: str, keys: list[BlockKey]) -> None:
        lru = self._lru.setdefault(replica, OrderedDict())
        # Tail first, so the head is the most recent: eviction drops a prompt's suffix before its
        # prefix, as the engine frees blocks, and a chain never loses its first links first.
        for key in reversed(keys):
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                self._holders.setdefault(key, set()).add(replica)
        while len(lru) > self.max_blocks_per_replica:
            evicted, _ = lru.popitem(last=False)
            self._drop_holder(evicted, replica)

    def remove(self, replica: str) -> None:
        for key in self._lru.pop(replica, ()):
            self._drop_holder(key, replica)

    def retain(self, replicas: set[str]) -> None:
        """Forgets every replica not in `replicas` (scaled down, replaced or dead)."""
        for replica in [r for r in self._lru if r not in replicas]:
            self.remove(replica)

    def num_blocks(self, replica: str) -> int:
        return len(self._lru.get(replica, ()))

    @property
    def replicas(self) -> list[str]:
        return list(self._lru)

    def _drop_holder(self, key: BlockKey, replica: str) -> None:
        holders = self._holders[key]
        holders.discard(replica)
        if not holders:
            del self._holders[key]
