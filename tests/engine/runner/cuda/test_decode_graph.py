"""The compiled, bucketed decode forward gives the uncompiled paged forward's logits and K/V."""

import random

import engine  # noqa: F401  # isort: split
from engine.config import EngineConfig
from engine.models.model_loader import load_model
from engine.runner.cuda.decode_graph import DecodeGraph, bucket
from engine.runner.kv_storage import KVStorage
from engine.runner.layer_caches import LayerCaches
from engine.runner.paged_attention import PagedLayerCache, StepLayout

import mlx.core as mx
import numpy as np
import pytest

BS = 4


@pytest.fixture(scope="module")
def model():
    return load_model(EngineConfig(device="cpu")).model


def _forward(model, storage: KVStorage, offsets, tables, tokens) -> mx.array:
    layout = StepLayout(offsets, tokens.shape[1], tables, BS)
    caches = [PagedLayerCache(storage, i, layout) for i in range(len(storage.shapes))]
    logits = model(tokens, cache=caches)[:, -1, :]
    mx.eval(logits, *storage.arrays())
    return logits


def _prefilled(model, prompts, tables) -> KVStorage:
    storage = KVStorage(LayerCaches(model).probe_shapes()[0], 48, BS, mx.float32)
    for prompt, table in zip(prompts, tables):
        _forward(model, storage, [0], [table[: -(-len(prompt) // BS)]], mx.array([prompt]))
    return storage


def test_bucket_is_the_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 64, 65)] == [1, 2, 4, 8, 8, 16, 64, 128]


def test_compiled_decode_matches_the_paged_forward_over_two_steps(model):
    rng = random.Random(0)
    lengths = [5, 19, 3]  # three rows pad to four; tables of 2, 5 and 1 blocks pad to 8 entries
    prompts = [[rng.randrange(1, 1000) for _ in range(n)] for n in lengths]
    free = list(range(48))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(n // BS + 2)] for n in lengths]  # room for two more tokens
    eager, graph_storage = _prefilled(model, prompts, tables), _prefilled(model, prompts, tables)
    graph = DecodeGraph(model, graph_storage)
    tokens = mx.array([7, 8, 9], dtype=mx.int32)
    for step in range(2):
        offsets = [n + step for n in lengths]
        step_tables = [t[: o // BS + 1] for t, o in zip(tables, offsets)]
        expected = _forward(model, eager, offsets, step_tables, tokens[:, None])
        got = graph.step(tokens, offsets, step_tables)
        mx.eval(got, *graph_storage.arrays())
        assert got.shape == expected.shape
        assert np.allclose(np.array(got), np.array(expected), atol=1e-4)
        tokens = mx.argmax(expected, axis=-1).astype(mx.int32)
    for mine, theirs in zip(graph_storage.arrays(), eager.arrays()):  # the scratch block aside
        assert np.allclose(np.array(mine[:, :48]), np.array(theirs[:, :48]), atol=1e-5)
