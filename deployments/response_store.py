"""A bounded in-process store of finished responses' conversations, for `previous_response_id`.

Owned by one Ingress replica, and per replica: with several Ingress replicas a follow-up may reach one
that never saw the first response and is answered 'previous response not found'. The Ingress runs one
replica by default; move this into a named actor before scaling the Ingress out. Bounded twice: at most
`max_entries` (least recently used go first) and each entry lives `ttl_s` seconds after it was stored.
Holds plain chat-template turns only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

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
