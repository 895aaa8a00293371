"""The CUDA decode-attention hook: off on the CPU, and transparent to every cache that is not a
kernel-ready paged decode cache (the kernel itself runs only on an NVIDIA GPU: bench/gpu.py checks it)."""

import sys

import engine  # noqa: F401  # isort: split
from engine.config import EngineConfig
from engine.models.model_loader import load_model
from engine.runner import attention_hook
from engine.runner.cpu.window_attention import InPlaceWindows
from engine.runner.cuda import cuda_attention
from engine.runner.cuda.decode_graph import CudaGraphDecode
from engine.runner.fast_path import Target
from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.layer_caches import LayerCaches

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import plamo
from mlx_lm.models.cache import make_prompt_cache


@pytest.fixture(scope="module")
def model():
    return load_model(EngineConfig(device="cpu")).model


def test_the_graph_and_its_kernel_are_not_picked_on_the_cpu(model):
    module = sys.modules[type(model).__module__]
    before = module.scaled_dot_product_attention
    assert not cuda_attention.kernel_available()
    storage = KVStorage(LayerCaches(model).probe_shapes()[0], 4, 16, mx.float32)
    for device in ("cpu", "gpu"):  # no CUDA backend here, whatever the device is called
        assert CudaGraphDecode().applies(Target(model, storage, device, None)) == "needs MLX's CUDA backend"
    assert module.scaled_dot_product_attention is before  # the check installs nothing


def test_installed_hook_passes_other_caches_to_the_original(model, monkeypatch):
    module = sys.modules[type(model).__module__]
    monkeypatch.setattr(module, "scaled_dot_product_attention", module.scaled_dot_product_attention)
    tokens = mx.array([[1, 17, 256, 1024, 5]])
    expected = model(tokens, cache=make_prompt_cache(model))
    assert attention_hook.install(model)
    hooked = module.scaled_dot_product_attention
    assert attention_hook.install(model) and module.scaled_dot_product_attention is hooked  # wraps once
    assert np.allclose(np.array(model(tokens, cache=make_prompt_cache(model))), np.array(expected), atol=1e-5)


def test_a_model_that_tiles_the_kv_it_fetched_is_refused_by_every_path_that_hands_over_pools(model):
    """plamo repeats its K/V heads with mx.tile after update_and_fetch: tiled pools are the wrong rows
    (on an H200 its graph decode was off by a logprob gap of 0.25). The bundled Llama routes as it is."""
    args = plamo.ModelArgs("plamo", 64, 2, 96, 4, 1e-5, 128, n_shared_head=2)
    tiles = plamo.Model(args)
    storage = KVStorage([LayerShape(2, 16, 16)] * 2, 16, 4, mx.float32)
    reason = "a layer's attention does not take the very K/V its cache returned"
    assert attention_hook.pool_refusal(tiles) == reason
    assert CudaGraphDecode().build(Target(tiles, storage, "gpu", None), {}) == (None, reason)
    assert InPlaceWindows().build(Target(tiles, storage, "cpu", None), {}) == (None, reason)
    assert attention_hook.pool_refusal(model) is None
