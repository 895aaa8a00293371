"""Maps requests to KV blocks and runs the prefix cache; the only caller of the BlockPool.

Prefix-cache contract: `match_prefix` is read only; `allocate` locks the matched blocks (takes a
reference) together with the new ones; `cache_full_blocks` inserts blocks once their KV is
computed; `free` unlocks. Only unlocked blocks are ever evicted (the pool's free queue).
A block's hash is SHA-256 over its parent's hash, its own tokens and any salt (the images behind its
image tokens), so equal hashes mean equal prefixes: a hit hands a request another request's KV, and
Python's 64-bit `hash()` of the same inputs could collide (vLLM moved to SHA-256 for the same reason).

    block hash = SHA-256( parent's hash, or 32 zero bytes for the first block
                          || the block's token ids as little-endian int64
                          || salt, if any )

With a disk tier (engine/core/prefix_disk.py), a match goes on past the RAM hits into the files;
`allocate` gives disk hits fresh blocks, cached under their hash, and queues their arrays in
`to_load` for the engine to write into the KV storage before the step runs. Every block that enters
the prefix cache is queued in `to_offload` for the engine to copy out before its id can be reused.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from engine.core.block_pool import BlockPool
from engine.core.prefix_disk import PrefixDiskStore
from engine.core.request import Request
from engine.core.state_slots import StateSlots

import numpy as np

BlockHash = bytes  # 32 bytes
_ROOT = bytes(32)


@dataclass
class PrefixMatch:
    block_ids: list[int]  # RAM hits: the matched prefix's first blocks
    block_hashes: list[BlockHash]  # every matched block's, RAM hits then disk hits
    disk_blocks: list[list[np.ndarray]] = field(default_factory=list)  # disk hits' arrays, after the RAM ones

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids) + len(self.disk_blocks)


NO_MATCH = PrefixMatch([], [])


def chain_hash(parent: BlockHash | None, tokens: list[int], salt: bytes | None = None) -> BlockHash:
    """`salt` keys what the tokens alone do not show: the images behind a block's image tokens."""
    digest = hashlib.sha256(parent or _ROOT)
    digest.update(struct.pack(f"<{len(tokens)}q", *tokens))
    if salt is not None:
        digest.update(salt)
    return digest.digest()


def _block_extra(request: Request, index: int, block_size: int) -> bytes | None:
    vision = request.vision
    return None if vision is None else vision.block_key(index * block_size, (index + 1) * block_size)


class KVCacheManager:
    def __init__(
        self, pool: BlockPool, block_size: int, enable_prefix_caching: bool, slots: StateSlots | None = None
    ):
        """`slots`: the state slots of a model with recurrent layers; a request holds one while it has
        blocks. Such a model's prefix cache is off (engine/llm_engine.py says why)."""
        assert slots is None or not enable_prefix_caching, "cached blocks would not restore recurrent state"
        self.pool = pool
        self.slots = slots
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found, in RAM or on disk
        self.prefix_disk_hits = 0  # of them, found on disk
        self.disk: PrefixDiskStore | None = None  # set by attach_disk
        self.to_offload: list[tuple[int, BlockHash]] = []  # newly cached (block id, hash): copy out
        self.to_load: list[tuple[int, list[np.ndarray]]] = []  # disk hits' (block id, arrays): copy in
        self._disk_memo: dict[BlockHash, list[np.ndarray]] = {}  # the last match's disk hits

    def attach_disk(self, store: PrefixDiskStore) -> None:
        assert self.enable_prefix_caching, "the disk tier extends the prefix cache"
        self.disk = store

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, request: Request) -> PrefixMatch:
        """Longest run of cached full blocks for the request's tokens; leaves one token to compute."""
        if not self.enable_prefix_caching:
            return NO_MATCH
        # The last token must be computed to get logits, so a full match stops one block short.
        max_blocks = (request.num_tokens - 1) // self.block_size
        match = PrefixMatch([], [])
        parent: BlockHash | None = None
        for i in range(max_blocks):
            tokens = request.all_token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = chain_hash(parent, tokens, _block_extra(request, i, self.block_size))
            block_id = None if match.disk_blocks else self.pool.lookup(parent)
            if block_id is not None:
                match.block_ids.append(block_id)
            elif (arrays := self._load_from_disk(parent)) is not None:
                match.disk_blocks.append(arrays)
            else:
                break
            match.block_hashes.append(parent)
        self.prefix_queries += request.num_tokens
        self.prefix_hits += match.num_blocks * self.block_size
        self.prefix_disk_hits += len(match.disk_blocks) * self.block_size
        # A request that waits for blocks is matched again each step: its disk hits stay read.
        self._disk_memo = dict(zip(match.block_hashes[len(match.block_ids) :], match.disk_blocks))
        return match

    def _load_from_disk(self, block_hash: BlockHash) -> list[np.ndarray] | None:
        if self.disk is None:
            return None
        memo = self._disk_memo.get(block_hash)
        return memo if memo is not None else self.disk.load(block_hash)

    def can_allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch = NO_MATCH) -> bool:
        if self.slots is not None and not self.slots.can_allocate(request):
            return False
        return self._num_needed(request, num_new_tokens, match) <= self.pool.num_free

    def allocate(self, request: Request, num_new_tokens: int, match: PrefixMatch = NO_MATCH) -> bool:
        """Gives the request blocks for `num_new_tokens` beyond its computed (or matched) tokens."""
        if not self.can_allocate(request, num_new_tokens, match):
            return False
        if self.slots is not None:
            self.slots.allocate(request)
        if match.num_blocks:
            assert not request.block_ids, "a prefix match applies only to a request with no blocks"
            self.pool.touch(match.block_ids)
            request.block_ids.extend(match.block_ids)
            if match.disk_blocks:
                self._allocate_disk_hits(request, match)
            request.block_hashes.extend(match.block_hashes)
        total = request.num_computed_tokens + match.num_blocks * self.block_size + num_new_tokens
        num_new_blocks = self.num_blocks_for(total) - len(request.block_ids)
        if num_new_blocks > 0:
            last = request.block_ids[-1] if request.block_ids else None
            want = self.num_blocks_for(request.num_prompt_tokens + request.max_tokens) - len(
                request.block_ids
            )
            request.block_ids.extend(self.pool.allocate(num_new_blocks, after=last, want=want))
        return True

    def _allocate_disk_hits(self, request: Request, match: PrefixMatch) -> None:
        """Fresh blocks for the disk hits, cached at once (their KV lands before the step runs)."""
        last = request.block_ids[-1] if request.block_ids else None
        block_ids = self.pool.allocate(len(match.disk_blocks), after=last)
        disk_hashes = match.block_hashes[len(match.block_ids) :]
        for block_id, block_hash, arrays in zip(block_ids, disk_hashes, match.disk_blocks):
            self.pool.cache(block_id, block_hash)
            self.to_load.append((block_id, arrays))
        request.block_ids.extend(block_ids)
        self._disk_memo = {}

    def _num_needed(self, request: Request, num_new_tokens: int, match: PrefixMatch) -> int:
        total = request.num_computed_tokens + match.num_blocks * self.block_size + num_new_tokens
        # Disk hits need fresh blocks like new tokens; RAM hits bring their own.
        num_new_blocks = max(0, self.num_blocks_for(total) - len(request.block_ids) - len(match.block_ids))
        # Matched blocks nobody holds sit in the free queue: locking them uses up free capacity.
        num_revived = sum(1 for b in match.block_ids if self.pool.is_free(b))
        return num_new_blocks + num_revived

    def cache_full_blocks(self, request: Request) -> None:
        """Inserts the request's newly computed full blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        # Only blocks whose tokens are all known: a pending token has KV but no id yet.
        num_full = min(request.num_computed_tokens, request.num_known_tokens) // self.block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        for i in range(len(request.block_hashes), num_full):
            tokens = request.all_token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = chain_hash(parent, tokens, _block_extra(request, i, self.block_size))
            request.block_hashes.append(parent)
            self.pool.cache(request.block_ids[i], parent)
            if self.disk is not None and self.pool.lookup(parent) == request.block_ids[i]:
                self.to_offload.append((request.block_ids[i], parent))

    def free(self, request: Request) -> None:
        """Unlocks all the request's blocks, tail first so its prefix outlives its suffix in the cache."""
        self.pool.free(list(reversed(request.block_ids)))
        if self.slots is not None:
            self.slots.free(request)
        request.block_ids.clear()
        request.block_hashes.clear()
