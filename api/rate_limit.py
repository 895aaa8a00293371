"""Token buckets per client: the pure logic of the rate limit (api/limits.py applies it to HTTP).

Owns each client's bucket: `capacity` tokens, refilled at `rate_per_s`; a request takes one token.
Memory is bounded: past `max_clients`, the longest-idle client's bucket is dropped (it comes back full,
which only forgives a client that has rested longest).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class TokenBuckets:
    def __init__(
        self,
        rate_per_s: float,
        capacity: int,
        max_clients: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        assert rate_per_s > 0 and capacity >= 1 and max_clients >= 1
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self.max_clients = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at_s)

    def acquire(self, client: str) -> float | None:
        """Takes a token for `client`: None if it had one, else the seconds until it will."""
        now = self._clock()
        tokens, at_s = self._buckets.pop(client, (float(self.capacity), now))
        tokens = min(float(self.capacity), tokens + (now - at_s) * self.rate_per_s)
        wait_s = None
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait_s = (1.0 - tokens) / self.rate_per_s
        self._buckets[client] = (tokens, now)  # most recent last
        if len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait_s
