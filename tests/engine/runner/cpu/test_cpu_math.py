"""engine/runner/cpu/cpu_math.py: exp from fused multiply-adds, and the softmax, SwiGLU and attention built on it,
against MLX's own functions; plus the split of a model into backbone and last-token head."""

import sys

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import activation_hook, cpu_math
from engine.runner.model_head import split_head

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models import activations


def test_exp_is_accurate_to_float32_and_flushes_below_minus_43():
    x = mx.concatenate(
        [-mx.abs(mx.random.normal((4096,), key=mx.random.key(0))) * 15, mx.array([0.0, -1e-9])]
    )
    exact = np.exp(np.array(x, dtype=np.float64))
    got = np.array(cpu_math._exp_kernel(x), dtype=np.float64)
    kept = np.array(x) > -43
    assert np.max(np.abs(got[kept] - exact[kept]) / exact[kept]) < 2e-7
    assert np.all(got[~kept] == 0.0) and np.all(exact[~kept] < 2.2e-19)
    assert np.array(cpu_math._exp_kernel(mx.array([-mx.inf, -50.0]))).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 1, 5), (2, 9, 1, 300), (1, 3, 3, 7, 10)])
def test_softmax_equals_mlx_on_every_shape(shape):
    scores = mx.random.normal(shape, key=mx.random.key(1)) * 6
    assert mx.allclose(cpu_math.softmax(scores), mx.softmax(scores, axis=-1, precise=True), atol=1e-6)


def test_softmax_of_a_row_does_not_depend_on_masked_padding():
    scores = mx.random.normal((3, 20), key=mx.random.key(2))
    alone = np.array(cpu_math.softmax(scores))
    for extra in (1, 5, 17):
        masked = mx.full((3, extra), -mx.inf)
        padded = mx.concatenate([scores[:, :7], masked, scores[:, 7:], masked], axis=-1)
        probs = np.array(cpu_math.softmax(padded))
        assert np.array_equal(np.concatenate([probs[:, :7], probs[:, 7 + extra : 20 + extra]], axis=1), alone)


@pytest.mark.parametrize("shape", [(1,), (16, 1, 1536), (7, 64)])
def test_swiglu_equals_silu_times_x(shape):
    gate = mx.random.normal(shape, key=mx.random.key(3)) * 8
    x = mx.random.normal(shape, key=mx.random.key(4))
    assert mx.allclose(cpu_math.swiglu(gate, x), nn.silu(gate) * x, atol=2e-6)
    transposed = gate.reshape(-1, 1).T
    assert mx.allclose(cpu_math.swiglu(transposed, transposed), nn.silu(transposed) * transposed, atol=2e-6)


def test_swiglu_keeps_float32_accuracy_from_minus_87_to_100_and_bfloat16_in_bfloat16():
    gate = mx.concatenate([mx.linspace(-100, 100, 200_001), mx.array([0.0, -0.0, 1e-30, -1e-30])])
    wide = np.array(gate, dtype=np.float64)
    exact = wide / (1 + np.exp(-wide))
    got = np.array(cpu_math.swiglu(gate, mx.ones_like(gate)), dtype=np.float64)
    kept = wide > -87
    compared = kept & (exact != 0)
    assert np.max(np.abs(got - exact)[compared] / np.abs(exact[compared])) < 3e-7  # MLX's own silu: 5e-7
    assert np.all(got[wide < -87.7] == 0.0)  # flushed, where exact is under 1e-36
    assert np.max(np.abs(got - exact)[~kept]) < 1e-35
    assert np.all(got[wide == 0] == 0.0)
    gate16 = (mx.random.normal((8, 64), key=mx.random.key(8)) * 4).astype(mx.bfloat16)
    out = cpu_math.swiglu(gate16, gate16)
    assert out.dtype == mx.bfloat16
    assert mx.allclose(out.astype(mx.float32), (nn.silu(gate16) * gate16).astype(mx.float32), rtol=2e-2)


# 150 queries run as causal blocks of 64 (the last one partial), over a fresh prompt and after 57 cached tokens.
@pytest.mark.parametrize(("length", "num_keys"), [(1, 1), (1, 40), (16, 16), (5, 37), (150, 150), (150, 207)])
def test_attention_equals_mlx_for_causal_boolean_additive_and_no_mask(length, num_keys):
    key = mx.random.key(5)
    q = mx.random.normal((2, 9, length, 64), key=key)
    k = mx.random.normal((2, 3, num_keys, 64), key=mx.random.key(6))
    v = mx.random.normal((2, 3, num_keys, 32), key=mx.random.key(7))
    visible = mx.arange(num_keys)[None, :] <= mx.arange(num_keys - length, num_keys)[:, None]
    boolean = mx.broadcast_to(visible, (2, 1, length, num_keys))
    additive = mx.where(boolean, 0.0, -1e9)
    for mask in (None, "causal", boolean, additive):
        expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        assert mx.allclose(cpu_math.attention(q, k, v, 0.125, mask), expected, atol=1e-5), mask


class _TinyLM(nn.Module):
    """An mlx-lm-shaped model: `model` (backbone) then a head, optionally scaling the logits."""

    def __init__(self, scale_logits: bool):
        super().__init__()
        self.model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 8))
        self.lm_head = nn.Linear(8, 50, bias=False)
        self.scale_logits = scale_logits

    def __call__(self, inputs, cache=None):
        logits = self.lm_head(self.model(inputs))
        return logits * 0.5 if self.scale_logits else logits


def test_split_head_only_where_backbone_then_head_is_the_whole_call():
    model = _TinyLM(scale_logits=False)
    head = split_head(model)
    assert head is not None
    tokens = mx.array([[3, 1, 4, 1, 5]])
    assert mx.array_equal(head(model.model(tokens)[:, -1:]), model(tokens)[:, -1:])
    assert split_head(_TinyLM(scale_logits=True)) is None  # the probe sees the call differ
    assert split_head(nn.Linear(2, 2)) is None  # no backbone


def test_the_engine_swaps_mlx_lms_swiglu_and_stock_restores_it_for_a_while(llm):
    module = sys.modules[type(llm.runner.model.layers[0].mlp).__module__]
    assert llm.runner.choice.names["math"] == "cpu_math" and module.swiglu is cpu_math.swiglu
    with activation_hook.stock(llm.runner.model):
        assert module.swiglu is activations.swiglu
    assert module.swiglu is cpu_math.swiglu
