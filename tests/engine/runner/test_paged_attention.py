"""Paged K/V written and read through block tables equals the plain contiguous K/V."""

import random

import engine  # noqa: F401  # isort: split
from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.paged_attention import PagedLayerCache, StepLayout

import mlx.core as mx
import numpy as np

BS = 4


def _write_prefix(storage: KVStorage, table: list[int], kv: mx.array) -> None:
    """Writes a whole sequence's K and V as one single-row prefill."""
    layout = StepLayout([0], kv.shape[2], [table], BS)
    PagedLayerCache(storage, 0, layout).update_and_fetch(kv, kv * 2)


def test_batched_decode_reads_each_rows_context_through_its_table():
    rng = random.Random(0)
    storage = KVStorage([LayerShape(2, 8, 8)], num_blocks=40, block_size=BS, dtype=mx.float32)
    free = list(range(40))
    rng.shuffle(free)  # non-consecutive tables exercise the gather path
    lengths = [5, 9, 1, 12]
    tables, seqs = [], []
    for n in lengths:
        table = [free.pop() for _ in range(n // BS + 1)]
        seq = mx.random.normal((1, 2, n, 8))
        _write_prefix(storage, table, seq)
        tables.append(table)
        seqs.append(seq)
    new = mx.random.normal((len(lengths), 2, 1, 8))
    layout = StepLayout(lengths, 1, tables, BS)
    keys, values = PagedLayerCache(storage, 0, layout).update_and_fetch(new, new * 2)
    mask = np.array(layout.mask(None))
    for b, n in enumerate(lengths):
        expected = mx.concatenate([seqs[b], new[b : b + 1]], axis=2)
        assert np.allclose(np.array(keys[b, :, : n + 1]), np.array(expected[0]))
        assert np.allclose(np.array(values[b, :, : n + 1]), np.array(expected[0] * 2))
        assert mask[b, 0, 0, : n + 1].all() and not mask[b, 0, 0, n + 1 :].any()


def test_single_row_fast_paths_match_the_gather_path():
    storage = KVStorage([LayerShape(2, 8, 8)], num_blocks=16, block_size=BS, dtype=mx.float32)
    seq = mx.random.normal((1, 2, 10, 8))
    for table in ([3, 4, 5], [7, 2, 9]):  # consecutive: slice read; scattered: gather
        _write_prefix(storage, table, seq)
        new = mx.random.normal((1, 2, 1, 8))
        layout = StepLayout([10], 1, [table], BS)
        assert (layout.block_run is not None) == (table == [3, 4, 5])
        keys, _ = PagedLayerCache(storage, 0, layout).update_and_fetch(new, new)
        expected = mx.concatenate([seq, new], axis=2)
        assert keys.shape == (1, 2, 11, 8)
        assert np.allclose(np.array(keys), np.array(expected))
