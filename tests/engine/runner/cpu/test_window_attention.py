"""In-place decode attention through windows over block runs: the same output as attention over
the gathered context, for any mix of runs, lengths, GQA and segments at the pool's end."""

import engine  # noqa: F401  # isort: split
from engine.runner.cpu.window_attention import plan_windows, runs, window_attention

import mlx.core as mx
import numpy as np
import pytest

BS = 4


def test_runs_split_a_table_at_every_jump():
    assert runs([3, 4, 5, 9, 10, 2]) == [(3, 3), (9, 2), (2, 1)]
    assert runs([7]) == [(7, 1)]


def test_windows_that_would_read_far_more_than_the_context_fall_back_to_the_gather():
    # Long runs in different slots: each slot is as wide as its longest segment.
    tables = [[0, 1, 2, 3, 4, 5], [10, 12, 13, 14, 15, 16], [20, 22, 24, 25, 26, 27]]
    assert plan_windows([24, 24, 24], tables, BS, pool_tokens=30 * BS) is None
    plan = plan_windows([24, 24], [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]], BS, 30 * BS)
    assert plan is not None and plan.widths == [24]


def test_rows_broken_at_different_places_share_narrow_slots():
    # 4 + 2 blocks and 1 + 5: longest runs first, the slots are 5 and 2 blocks wide (7 for a
    # 6-block context); in table order they would be 4 and 5 wide, past the gather's cost.
    tables = [[0, 1, 2, 3, 10, 11], [20, 30, 31, 32, 33, 34]]
    plan = plan_windows([24, 24], tables, BS, pool_tokens=40 * BS)
    assert plan is not None and plan.widths == [5 * BS, 2 * BS]


def reference(queries, k_pool, v_pool, tables, lengths, scale):
    outs = []
    for b, (table, length) in enumerate(zip(tables, lengths)):
        k = k_pool[:, mx.array(table)].reshape(k_pool.shape[0], -1, k_pool.shape[-1])[:, :length]
        v = v_pool[:, mx.array(table)].reshape(v_pool.shape[0], -1, v_pool.shape[-1])[:, :length]
        outs.append(mx.fast.scaled_dot_product_attention(queries[b : b + 1], k[None], v[None], scale=scale))
    return mx.concatenate(outs)


@pytest.mark.parametrize("num_q,num_kv", [(6, 2), (4, 4)])
def test_window_attention_equals_attention_over_the_gathered_context(num_q, num_kv):
    num_blocks, dim = 20, 8
    key = mx.random.key(0)
    k1, k2, k3 = mx.random.split(key, 3)
    k_pool = mx.random.normal((num_kv, num_blocks, BS, dim), key=k1)
    v_pool = mx.random.normal((num_kv, num_blocks, BS, dim), key=k2)
    tables = [[2, 3, 4], [7, 8, 12, 13], [18, 19], [0, 15, 16, 17]]  # the third ends at the pool's end
    lengths = [11, 14, 5, 13]
    queries = mx.random.normal((len(tables), num_q, 1, dim), key=k3)
    plan = plan_windows(lengths, tables, BS, num_blocks * BS)
    assert plan is not None and plan.widths == [11, 6]  # each row's longest run in the first slot
    index = plan.window_index(num_kv)
    out = window_attention(queries, k_pool, v_pool, plan, index, 0.3)
    expected = reference(queries, k_pool, v_pool, tables, lengths, 0.3)
    assert out.shape == expected.shape
    assert np.allclose(np.array(out), np.array(expected), atol=1e-5)
