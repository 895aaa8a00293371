"""The previous_response_id store: bounded by entries (least recently used first) and by age."""

from __future__ import annotations

from deployments.response_store import ResponseStore

TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_get_returns_a_copy_of_what_was_put():
    store = ResponseStore()
    store.put("r1", TURNS)
    got = store.get("r1")
    assert got == TURNS
    got.append({"role": "user", "content": "more"})
    assert store.get("r1") == TURNS and store.get("missing") is None


def test_least_recently_used_entry_goes_first():
    store = ResponseStore(max_entries=2)
    store.put("r1", TURNS)
    store.put("r2", TURNS)
    store.get("r1")  # r2 is now the least recently used
    store.put("r3", TURNS)
    assert store.get("r2") is None and store.get("r1") == TURNS and store.get("r3") == TURNS
    assert len(store) == 2


def test_entries_expire_after_the_ttl():
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put("r1", TURNS)
    clock.now_s = 9.9
    assert store.get("r1") == TURNS
    clock.now_s = 10.0
    assert store.get("r1") is None and len(store) == 0
