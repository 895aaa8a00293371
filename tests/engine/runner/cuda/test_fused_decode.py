"""The fused decode's forward (engine/runner/cuda/fused_decode.py), run with the MLX operations its CUDA
kernels must equal: the model's own logits and K/V, its shape check, and a probe that catches a wrong one."""

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import fused_decode
from engine.runner.cuda.fused_decode import _PROBE_STEPS, probe, reference, shape_refusal
from engine.runner.cuda.layer_kernels import rotate
from engine.runner.fast_path import Target
from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.model_head import split_head

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen3

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "rope_theta": 10_000.0,
    "tie_word_embeddings": False,
}
LLAMA3_SCALING = {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 16,
    "rope_type": "llama3",
}


def _target(model: nn.Module, block_size: int = 4, dtype: mx.Dtype = mx.float32) -> Target:
    attn = model.layers[0].self_attn
    shape = LayerShape(attn.n_kv_heads, attn.head_dim, attn.head_dim)
    storage = KVStorage([shape] * len(model.layers), 16, block_size, dtype)
    return Target(model, storage, "cpu", split_head(model))


def _llama(seed: int = 0, **config) -> nn.Module:
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict({**LLAMA, **config}))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize(
    "config",
    [{}, {"rope_traditional": True}, {"rope_scaling": LLAMA3_SCALING}, {"attention_bias": True}],
    ids=["llama", "traditional_rope", "llama3_rope", "qkv_bias"],
)
def test_the_fused_forward_gives_the_models_own_logits(config):
    target = _target(_llama(**config))
    assert shape_refusal(target) is None
    fused = reference(target)
    assert not isinstance(fused, str)
    assert probe(fused, target) is None


def test_the_probe_catches_a_forward_that_rotates_the_wrong_pairs():
    target = _target(_llama())
    fused = reference(target)
    assert not isinstance(fused, str)
    fused.layers[1].attn.traditional = True
    reason = probe(fused, target)
    assert reason is not None and "differ from the model's own call" in reason


def _bf16_target(layers: int) -> Target:
    model = _llama(num_hidden_layers=layers)
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return _target(model, dtype=mx.bfloat16)


def test_a_half_type_forward_past_the_tolerance_is_judged_against_float32(monkeypatch):
    # Over many layers bf16 rounding alone passes the tolerance (the bundled SmolLM2 on an H200: 0.019
    # from the own call, and each path 0.026 from float32); with no tolerance left, every probe here
    # takes the float32 look.
    monkeypatch.setattr(fused_decode, "_HALF_TOLERANCE", 0.0)
    target = _bf16_target(layers=8)
    fused = reference(target)  # fuses the model's projections in place
    assert not isinstance(fused, str)
    weights = tree_flatten(target.model.parameters())
    assert probe(fused, target) is None  # as far from float32 as the own call
    after = tree_flatten(target.model.parameters())
    assert all(a is b for (_, a), (_, b) in zip(weights, after, strict=True))  # the very arrays back
    wrong_target = _bf16_target(layers=8)
    wrong = reference(wrong_target)
    assert not isinstance(wrong, str)
    wrong.layers[1].attn.traditional = True  # before its first run: the forward compiles once
    reason = probe(wrong, wrong_target)
    assert reason is not None and "from its float32 call" in reason


def test_a_half_type_model_too_large_for_the_float32_look_keeps_the_refusal(monkeypatch):
    monkeypatch.setattr(fused_decode, "_HALF_TOLERANCE", 0.0)
    monkeypatch.setattr(fused_decode, "_FLOAT32_PROBE_MAX_BYTES", 1)
    target = _bf16_target(layers=2)
    fused = reference(target)
    assert not isinstance(fused, str)
    reason = probe(fused, target)
    assert reason is not None and "too large to hold in float32" in reason


def test_decoded_tokens_and_written_kv_match_the_models_own_decode():
    """Greedy decode of two rows through the fused forward and through mlx-lm's own cache: same tokens,
    and the pools hold the K/V mlx-lm's cache holds."""
    model = _llama(seed=1)
    target = _target(model)
    fused = reference(target)
    assert not isinstance(fused, str)
    prompts = [[5, 9, 17], [3]]
    # Decode one token at a time from position 0 (prompts go through as decode rows too).
    from mlx_lm.models.cache import make_prompt_cache

    for r, prompt in enumerate(prompts):
        cache = make_prompt_cache(model)
        own, mine, token = [], [], None
        for pos in range(_PROBE_STEPS + 2):
            token = prompt[pos] if pos < len(prompt) else token
            own_logits = model(mx.array([[token]]), cache=cache)[:, -1, :]
            table = [r * 4 + b for b in range(pos // 4 + 1)]
            got = fused.step(mx.array([token], dtype=mx.int32), [pos], [table])
            assert np.allclose(np.array(got), np.array(own_logits), atol=1e-4)
            token = int(mx.argmax(own_logits, axis=-1).item())
            own.append(token)
            mine.append(int(mx.argmax(got, axis=-1).item()))
        assert mine == own
        keys = cache[0].keys[0, :, : _PROBE_STEPS + 2]  # (kv heads, tokens, D)
        pool = target.storage.keys[0][:, r * 4 : r * 4 + 3].reshape(keys.shape[0], -1, keys.shape[-1])
        assert np.allclose(np.array(pool[:, : keys.shape[1]]), np.array(keys), atol=1e-5)


def test_rotation_by_the_rope_of_a_basis_equals_mlx_rope():
    for traditional in (False, True):
        rope = nn.RoPE(32, traditional=traditional, base=10_000.0)
        x = mx.random.normal((3, 4, 1, 32))
        offsets = mx.array([0, 7, 300])
        basis = (mx.arange(32) % 2 == 0) if traditional else (mx.arange(32) < 16)
        cos_sin = rope(
            mx.broadcast_to(basis.astype(mx.float32).reshape(1, 1, 1, 32), (3, 1, 1, 32)), offset=offsets
        )
        got = rotate(x[:, :, 0], cos_sin.reshape(3, 32), traditional)
        assert np.allclose(np.array(got), np.array(rope(x, offset=offsets)[:, :, 0]), atol=1e-5)


def test_models_of_another_shape_are_refused_with_the_reason():
    mx.random.seed(0)
    qwen = qwen3.Model(
        qwen3.ModelArgs.from_dict({**LLAMA, "model_type": "qwen3", "max_position_embeddings": 64})
    )
    storage = _target(_llama()).storage
    assert shape_refusal(Target(qwen, storage, "cpu", split_head(qwen))) == "per-head q/k norms"
    assert "head is not split" in (shape_refusal(Target(_llama(), storage, "cpu", None)) or "")
