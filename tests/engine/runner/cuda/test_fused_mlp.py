"""Fusing the MLPs' gate and up projections leaves the model's logits as they were."""

import engine  # noqa: F401  # isort: split
from engine.config import EngineConfig
from engine.models.model_loader import load_model
from engine.runner.cuda.fused_mlp import fuse_gate_up

import mlx.core as mx
import numpy as np


def test_fused_gate_up_gives_the_same_logits():
    model = load_model(EngineConfig(device="cpu")).model
    tokens = mx.array([[1, 17, 256, 1024, 5, 9]])
    expected = model(tokens)
    pairs = fuse_gate_up(model)
    assert len(pairs) == len(model.layers)
    assert np.allclose(np.array(model(tokens)), np.array(expected), atol=1e-4)
    assert fuse_gate_up(model) == []  # already fused layers are left alone
