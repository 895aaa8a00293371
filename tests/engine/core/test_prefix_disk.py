"""The prefix cache's disk tier on NumPy arrays alone: the store's files, its writer thread, and the KV
cache manager matching past RAM into the files."""

from __future__ import annotations

import logging
import os
import time

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager, chain_hash
from engine.core.prefix_disk import PrefixDiskStore, identity_dir
from engine.core.prefix_disk_writer import PrefixDiskWriter
from engine.core.request import Request
from engine.messages import SamplingParams

import numpy as np

IDENTITY = "model m | float32 kv auto block 4 layers 2x8x8*2 | block_size 4"


def block(seed: int) -> list[np.ndarray]:
    """One block's arrays as KVStorage.arrays() gives them: (heads, block_size, dim) per array."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(4)]


def key(i: int) -> bytes:
    return chain_hash(None, [i])


def same(a: list[np.ndarray] | None, b: list[np.ndarray]) -> bool:
    return a is not None and len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_round_trip_survives_a_new_store_on_the_same_directory(tmp_path):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    assert store.save(key(1), block(1))
    assert not store.save(key(1), block(1)), "a block on disk is not written again"
    reopened = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    assert reopened.num_blocks == 1
    assert same(reopened.load(key(1)), block(1))
    assert reopened.load(key(2)) is None


def test_the_bound_evicts_the_least_recently_used_first(tmp_path):
    one = len(_bytes_of_one(tmp_path))
    store = PrefixDiskStore(tmp_path / "s", IDENTITY, max_bytes=3 * one)
    for i in range(3):
        store.save(key(i), block(i))
    assert store.load(key(0)) is not None  # a hit makes block 0 the most recent
    store.save(key(3), block(3))
    assert store.num_bytes <= 3 * one
    assert [store.contains(key(i)) for i in range(4)] == [True, False, True, True]
    assert not store.path_of(key(1)).exists()


def test_a_restart_orders_the_index_by_file_time(tmp_path):
    one = len(_bytes_of_one(tmp_path))
    store = PrefixDiskStore(tmp_path / "s", IDENTITY, max_bytes=3 * one)
    for i in range(3):
        store.save(key(i), block(i))
    now = time.time()
    for i, age_s in enumerate([10, 30, 20]):  # block 1 is the oldest
        os.utime(store.path_of(key(i)), (now - age_s, now - age_s))
    reopened = PrefixDiskStore(tmp_path / "s", IDENTITY, max_bytes=3 * one)
    reopened.save(key(3), block(3))
    assert [reopened.contains(key(i)) for i in range(4)] == [True, False, True, True]


def test_a_corrupted_file_is_skipped_logged_and_removed(tmp_path, caplog):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    store.save(key(1), block(1))
    path = store.path_of(key(1))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in the payload
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert store.load(key(1)) is None
    assert path.name in caplog.text and "checksum" in caplog.text
    assert not path.exists() and not store.contains(key(1))
    assert store.num_bad_files == 1


def test_a_truncated_file_is_skipped(tmp_path, caplog):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    store.save(key(1), block(1))
    path = store.path_of(key(1))
    path.write_bytes(path.read_bytes()[:40])
    with caplog.at_level(logging.WARNING):
        assert store.load(key(1)) is None
    assert path.name in caplog.text


def test_a_file_of_another_identity_is_never_served(tmp_path, caplog):
    other = PrefixDiskStore(tmp_path, "model other | int8", max_bytes=1 << 20)
    other.save(key(1), block(1))
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    assert store.dir != other.dir and not store.contains(key(1))
    # Even copied into this identity's directory, its header gives it away.
    os.replace(other.path_of(key(1)), store.path_of(key(1)))
    reopened = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    with caplog.at_level(logging.WARNING):
        assert reopened.load(key(1)) is None
    assert "another model" in caplog.text and not store.path_of(key(1)).exists()


def test_a_file_whose_arrays_differ_from_the_storage_is_never_served(tmp_path, caplog):
    PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20).save(key(1), block(1))
    layout = [(np.dtype(np.float32), (2, 4, 16))] * 4  # the storage's head dim is 16, not 8
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20, layout=layout)
    with caplog.at_level(logging.WARNING):
        assert store.load(key(1)) is None
    assert "shapes differ" in caplog.text
    assert PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20).num_blocks == 0


def test_a_leftover_temp_file_is_ignored(tmp_path):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    store.save(key(1), block(1))
    # A writer that died between writing its temp file and renaming it into place.
    half = store.path_of(key(2)).with_name(f".{key(2).hex()}.kvb.dead1234.tmp")
    half.write_bytes(store.path_of(key(1)).read_bytes()[:100])
    reopened = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    assert reopened.num_blocks == 1 and reopened.load(key(2)) is None
    old_s = time.time() - 3600
    os.utime(half, (old_s, old_s))
    PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    assert not half.exists(), "a dead writer's temp file is cleaned up once stale"


def test_the_writer_saves_in_the_background_and_drops_beyond_its_bound(tmp_path):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    one_bytes = sum(a.nbytes for a in block(0))
    writer = PrefixDiskWriter(store, max_pending_bytes=one_bytes)
    assert writer.submit(key(1), block(1))
    writer.flush()
    assert store.contains(key(1)) and not writer.wants(key(1))
    writer.close()
    assert not writer.submit(key(2), block(2)) and writer.num_dropped == 1
    assert writer.num_written == 1 and identity_dir(tmp_path, IDENTITY) == store.dir


def test_a_full_queue_drops_instead_of_waiting(tmp_path):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    one_bytes = sum(a.nbytes for a in block(0))
    writer = PrefixDiskWriter(store, max_pending_bytes=one_bytes)
    accepted = [writer.submit(key(i), block(i)) for i in range(50)]
    writer.close()
    assert not all(accepted) and writer.num_dropped == accepted.count(False)
    assert writer.num_written == accepted.count(True) == store.num_blocks


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), max_tokens=8)


def test_the_kv_manager_matches_past_ram_into_the_disk_tier(tmp_path):
    store = PrefixDiskStore(tmp_path, IDENTITY, max_bytes=1 << 20)
    kv = KVCacheManager(BlockPool(16), block_size=4, enable_prefix_caching=True)
    kv.attach_disk(store)
    first = _request("a", list(range(13)))
    assert kv.allocate(first, 13)
    first.num_computed_tokens = 13
    kv.cache_full_blocks(first)
    assert [b for b, _ in kv.to_offload] == first.block_ids[:3]
    for i, (_, block_hash) in enumerate(kv.to_offload):
        store.save(block_hash, block(i))
    # A fresh manager (a restart): RAM is empty, the disk has the first three blocks.
    kv = KVCacheManager(BlockPool(16), block_size=4, enable_prefix_caching=True)
    kv.attach_disk(store)
    second = _request("b", list(range(13)) + [7])
    match = kv.match_prefix(second)
    assert match.num_blocks == 3 and not match.block_ids and kv.prefix_disk_hits == 12
    assert kv.allocate(second, 2, match)
    assert [b for b, _ in kv.to_load] == second.block_ids[:3]
    assert all(same(arrays, block(i)) for i, (_, arrays) in enumerate(kv.to_load))
    # The loaded blocks are cached in RAM now: a third request finds them there, not on disk.
    third = _request("c", list(range(13)) + [8])
    match = kv.match_prefix(third)
    assert match.block_ids == second.block_ids[:3] and not match.disk_blocks
    assert not kv.to_offload, "blocks read from disk are not written back"


def _bytes_of_one(tmp_path) -> bytes:
    probe = PrefixDiskStore(tmp_path / "probe", IDENTITY, max_bytes=1 << 20)
    probe.save(key(99), block(99))
    return probe.path_of(key(99)).read_bytes()
