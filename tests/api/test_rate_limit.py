"""Token buckets: a burst, then the sustained rate, per client, with bounded memory."""

from __future__ import annotations

from api.rate_limit import TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_refill_rate():
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=2.0, capacity=3, clock=clock)
    assert [buckets.acquire("a") for _ in range(3)] == [None, None, None]
    assert buckets.acquire("a") == 0.5  # empty: one token is half a second away
    clock.now += 0.5
    assert buckets.acquire("a") is None and buckets.acquire("a") is not None


def test_a_refused_request_takes_no_token_and_the_bucket_never_overfills():
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=1.0, capacity=2, clock=clock)
    buckets.acquire("a"), buckets.acquire("a")
    assert buckets.acquire("a") == 1.0 and buckets.acquire("a") == 1.0
    clock.now += 3600
    assert [buckets.acquire("a") is None for _ in range(3)] == [True, True, False]


def test_clients_have_their_own_buckets_and_the_idlest_is_dropped_past_the_bound():
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=0.001, capacity=1, max_clients=2, clock=clock)
    assert buckets.acquire("a") is None and buckets.acquire("b") is None
    assert buckets.acquire("a") is not None  # a is empty; b is untouched by a
    assert buckets.acquire("c") is None  # evicts b, the longest idle
    assert buckets.acquire("b") is None  # back with a full bucket
