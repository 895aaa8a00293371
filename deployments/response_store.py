"""A bounded store of finished responses' conversations, for `previous_response_id`, and its Serve shell.

`ResponseStore` is the logic, in one process; `ResponseStoreServer` is the one-replica deployment that holds
it for the whole app, so that a follow-up finds its previous response whichever Ingress replica gets it;
`RemoteStore` is the Ingress's client of that deployment. Bounded twice: at most `max_entries` (least
recently used go first) and each entry lives `ttl_s` seconds after it was stored. Plain chat-template
turns only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from ray import serve

Turn = dict[str, Any]

DEFAULT_MAX_ENTRIES = 1024
DEFAULT_TTL_S = 3600.0


class ResponseStore:
    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        assert max_entries >= 1 and ttl_s > 0
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, list[Turn]]] = OrderedDict()

    def put(self, response_id: str, turns: list[Turn]) -> None:
        """`turns`: the whole conversation up to and including the response's own assistant turn."""
        self._evict_expired()
        self._entries[response_id] = (self._clock() + self._ttl_s, list(turns))
        self._entries.move_to_end(response_id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> list[Turn] | None:
        """The stored turns (a copy), or None if unknown or expired; a hit counts as a use."""
        self._evict_expired()
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)
        return list(entry[1])

    def __len__(self) -> int:
        return len(self._entries)

    def _evict_expired(self) -> None:
        now = self._clock()
        expired = [key for key, (expires_at_s, _) in self._entries.items() if expires_at_s <= now]
        for key in expired:
            del self._entries[key]


class Store(Protocol):
    async def put(self, response_id: str, turns: list[Turn]) -> None: ...

    async def get(self, response_id: str) -> list[Turn] | None: ...


class LocalStore:
    """A `ResponseStore` of this process behind the async interface (tests, one-process use)."""

    def __init__(self, store: ResponseStore | None = None):
        self.store = store or ResponseStore()

    async def put(self, response_id: str, turns: list[Turn]) -> None:
        self.store.put(response_id, turns)

    async def get(self, response_id: str) -> list[Turn] | None:
        return self.store.get(response_id)


class RemoteStore:
    """The Ingress's client of the app's `ResponseStoreServer` (a deployment handle, watched or not)."""

    def __init__(self, handle: Any):
        self._handle = handle

    async def put(self, response_id: str, turns: list[Turn]) -> None:
        await self._handle.put.remote(response_id, turns)

    async def get(self, response_id: str) -> list[Turn] | None:
        turns: list[Turn] | None = await self._handle.get.remote(response_id)
        return turns


@serve.deployment
class ResponseStoreServer:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_s: float = DEFAULT_TTL_S):
        self._store = ResponseStore(max_entries, ttl_s)

    async def put(self, response_id: str, turns: list[Turn]) -> None:
        self._store.put(response_id, turns)

    async def get(self, response_id: str) -> list[Turn] | None:
        return self._store.get(response_id)

    async def num_entries(self) -> int:
        return len(self._store)
