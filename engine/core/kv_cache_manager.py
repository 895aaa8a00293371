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
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from engine.core.block_pool import BlockPool
from engine.core.request import Request
from engine.core.state_slots import StateSlots

BlockHash = bytes  # 32 bytes
_ROOT = bytes(32)


@dataclass
class PrefixMatch:
    block_ids: list[int]
    block_hashes: list[BlockHash]

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


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
        self.prefix_hits = 0  # tokens found

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
            block_id = self.pool.lookup(parent)
            if block_id is None:
                break
            match.block_ids.append(block_id)
            match.block_hashes.append(parent)
        self.prefix_queries += request.num_tokens
        self.prefix_hits += match.num_blocks * self.block_size
        return match

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

    def _num_needed(self, request: Request, num_new_tokens: int, match: PrefixMatch) -> int:
        total = request.num_computed_tokens + match.num_blocks * self.block_size + num_new_tokens
        num_new_blocks = max(0, self.num_blocks_for(total) - len(request.block_ids) - match.num_blocks)
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

    def free(self, request: Request) -> None:
        """Unlocks all the request's blocks, tail first so its prefix outlives its suffix in the cache."""
        self.pool.free(list(reversed(request.block_ids)))
        if self.slots is not None:
            self.slots.free(request)
        request.block_ids.clear()
        request.block_hashes.clear()
