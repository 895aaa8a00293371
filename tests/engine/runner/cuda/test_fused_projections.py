"""Fusing q/k/v and gate/up projections into one product each leaves the model's logits as they were."""

import engine  # noqa: F401  # isort: split
from engine.config import EngineConfig
from engine.models.model_loader import load_model
from engine.runner.cuda.fused_projections import fuse_gate_up, fuse_qkv

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx_lm.models import llama

TOKENS = mx.array([[1, 17, 256, 1024, 5, 9]])


def test_fused_projections_give_the_same_logits():
    model = load_model(EngineConfig(device="cpu")).model
    expected = model(TOKENS)
    assert len(fuse_gate_up(model)) == len(fuse_qkv(model)) == len(model.layers)
    assert np.allclose(np.array(model(TOKENS)), np.array(expected), atol=1e-4)
    assert fuse_gate_up(model) == fuse_qkv(model) == []  # already fused layers are left alone


def test_quantized_and_biased_projections_fuse_too():
    config = {
        "model_type": "llama",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 2048,
        "attention_bias": True,
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    nn.quantize(model, group_size=64, bits=4)
    expected = model(TOKENS)
    assert len(fuse_qkv(model)) == len(fuse_gate_up(model)) == 2
    assert type(model.layers[0].self_attn.q_proj._fused.linear) is nn.QuantizedLinear
    assert np.allclose(np.array(model(TOKENS)), np.array(expected), atol=1e-4)
