"""Decode steps as one C forward: built and used for the bundled model, the same greedy tokens as MLX's
path, matching logits on other shapes, and refused where it cannot serve a model."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.runner.cpu import cpu_decode
from engine.runner.cpu.cpu_decode import CForwardDecode, CpuDecode
from engine.runner.fast_path import Target
from engine.runner.kv_storage import KVStorage, LayerShape

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models import llama

from tests.engine.engine_helpers import chat_ids, run_to_completion, token_ids

# Greedy, and never stopping early: every request is still decoding when the last one arrives.
FIXED_LENGTH = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def mlx_decode() -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=128 << 20, max_num_seqs=16, max_num_batched_tokens=128, cpu_decode=False
        )
    )


def test_the_bundled_model_decodes_through_the_kernel(llm, mlx_decode):
    assert isinstance(llm.runner.decode, CpuDecode)
    assert mlx_decode.runner.decode is None
    # and the stats the status endpoint shows say which path each engine took
    assert llm.stats().compute.decode == "c_forward"
    assert mlx_decode.stats().compute.decode == "mlx"
    assert mlx_decode.stats().compute.not_taken["c_forward"] == "engine.cpu_decode is false"


def test_an_engine_on_the_kernel_samples_what_mlx_samples(llm, mlx_decode):
    # Texts of its own: the session's engine caches prefixes, and other tests want theirs uncached.
    texts = ["Name two rivers.", "What is three times four?", "Write a line about snow.", "Say bye."]
    prompts = [chat_ids(llm, t) for t in texts] + [chat_ids(llm, texts[0]) + chat_ids(llm, texts[2])]
    rows_seen: list[int] = []  # rows per call: decode rows and prefill chunks' tokens
    sampled_seen: list[int] = []  # rows per call that get logits: decode rows and chunks' last tokens
    decode = llm.runner.decode
    originals = {"step": decode.step, "step_greedy": decode.step_greedy}
    greedy_rows: list[int] = []  # rows per call whose tokens the screened head chose

    def counting(name):
        def call(tokens, positions, tables, logit_rows=None):
            result = originals[name](tokens, positions, tables, logit_rows)
            if result is not None:  # step_greedy's None: the engine calls step next
                rows_seen.append(len(tokens))
                sampled_seen.append(len(tokens) if logit_rows is None else len(logit_rows))
                if name == "step_greedy":
                    greedy_rows.append(len(result))
            return result

        return call

    for name in originals:
        setattr(decode, name, counting(name))
    try:
        outs = {}
        for name, engine_ in (("c", llm), ("mlx", mlx_decode)):
            # Arrivals over three steps: decode batches of changing size, rows at different positions,
            # and shared prefix blocks (the chat template's system prompt) read by several rows.
            arrivals = {0: [], 1: [], 3: []}
            for i, ids in enumerate(prompts):
                arrivals[[0, 1, 3][min(i, 2)]].append(GenerateRequest(f"{name}-{i}", ids, FIXED_LENGTH))
            result = run_to_completion(engine_, arrivals)
            outs[name] = [token_ids(result[f"{name}-{i}"]) for i in range(len(prompts))]
    finally:
        for name in originals:
            delattr(decode, name)
    assert max(sampled_seen) == len(prompts) and min(sampled_seen) == 1
    # Its head is packed (8-bit codes, exact_pack.py), which the kernel reads in fewer bytes than the
    # screen's bfloat16 copy: no screening (tests/engine/runner/cpu/test_cpu_greedy.py has it).
    assert llm.runner.decode.screen is None and not greedy_rows
    assert max(rows_seen) > len(prompts)  # the prompts' prefill chunks went through the kernel too
    assert outs["c"] == outs["mlx"]


def tiny_llama(**overrides) -> nn.Module:
    args = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96}
    args |= {"num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 50}
    args |= {"rope_theta": 10000.0, "tie_word_embeddings": False}
    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs(**(args | overrides)))
    mx.eval(model.parameters())
    return model


def tiny_storage(model: nn.Module, block_size: int = 4) -> KVStorage:
    attn = model.model.layers[0].self_attn
    shape = LayerShape(attn.n_kv_heads, attn.head_dim, attn.head_dim)
    return KVStorage([shape] * len(model.model.layers), 8, block_size, mx.float32)


def refusal(model, storage) -> str | None:
    """Why the C forward does not serve `model`: its load-time check's answer, else its build's."""
    target = Target(model, storage, "cpu", None)
    return CForwardDecode().applies(target) or CForwardDecode().build(target, {})[1]


def make_cpu_decode(model, storage, exact_packing: bool = True) -> CpuDecode | None:
    target = Target(model, storage, "cpu", None, exact_packing=exact_packing)
    return None if CForwardDecode().applies(target) else CForwardDecode().build(target, {})[0]


def test_another_shape_builds_and_matches_mlx_across_blocks():
    # 16-wide heads, 2 query heads per K/V head, 4-token blocks, an untied head: the load probe decodes
    # six tokens over two blocks per row and compares each step with MLX's forward.
    model = tiny_llama()
    assert make_cpu_decode(model, tiny_storage(model)) is not None
    tied = tiny_llama(tie_word_embeddings=True, num_key_value_heads=4)
    assert make_cpu_decode(tied, tiny_storage(tied, block_size=2)) is not None


def test_a_kernel_that_disagrees_with_mlx_is_not_used(monkeypatch):
    model = tiny_llama()
    sizes = cpu_decode._llama_sizes(model, tiny_storage(model))
    wrong = dict(sizes, ROPE_BASE="500.0f")  # positions rotate differently from the model's RoPE
    monkeypatch.setattr(cpu_decode, "_llama_sizes", lambda *_: wrong)
    assert refusal(model, tiny_storage(model)) == "its logits differ from MLX's on the load probe"


def test_models_it_cannot_serve_keep_mlx_and_say_why():
    reasons = {"attention_bias": "biases", "mlp_bias": "biases", "rope_traditional": "RoPE"}
    for override, word in reasons.items():
        model = tiny_llama(**{override: True})
        assert word in refusal(model, tiny_storage(model)), override
    three_bit = tiny_llama()
    nn.quantize(three_bit, group_size=32, bits=3)  # 4- and 8-bit codes are read (test_cpu_decode_weights.py)
    assert "3-bit weights" in refusal(three_bit, tiny_storage(three_bit))
    half = tiny_llama()
    half.set_dtype(mx.float16)
    assert "float32" in refusal(half, tiny_storage(half))
    model = tiny_llama()
    assert (
        CForwardDecode().applies(Target(model, tiny_storage(model), "gpu", None)) == "needs MLX's CPU backend"
    )


def test_no_compiler_means_no_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_RAY_SERVE_CACHE", str(tmp_path))  # nothing built yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    model = tiny_llama()
    assert "did not build" in refusal(model, tiny_storage(model))


def test_the_kernel_writes_each_rows_new_slot_and_nothing_else():
    model = tiny_llama()
    storage = tiny_storage(model)
    decode = make_cpu_decode(model, storage)
    before = [np.array(a) for a in storage.arrays()]
    # Row 0 at position 5 (block 3, slot 1), row 1 at position 2 (block 6, slot 2).
    decode.step(mx.array([7, 9]), [5, 2], [[2, 3], [6]])
    for i, (old, new) in enumerate(zip(before, storage.arrays())):
        changed = np.argwhere(np.any(old != np.asarray(new), axis=-1))
        assert sorted(map(tuple, changed[:, 1:])) == [(3, 1)] * 2 + [(6, 2)] * 2, i  # two heads each


@pytest.mark.parametrize("block_size", [16, 32])
def test_attention_over_every_length_gives_mlxs_logits(block_size):
    # 32-wide heads, two query heads per K/V head, a 70-token chunk whose rows attend to 1-70 positions,
    # over blocks in reverse order: both loops of cpu_attention.h (the vector one, where the build has
    # it, in 16-position steps full and partial, one or two a block).
    model = tiny_llama(hidden_size=128, vocab_size=300)
    storage = tiny_storage(model, block_size=block_size)
    decode = make_cpu_decode(model, storage)
    assert decode is not None and decode.serves_chunks
    tokens = np.array([(7 * i + 3) % 300 for i in range(70)], np.int32)
    table = np.tile(np.arange(-(-len(tokens) // block_size), dtype=np.int32)[::-1], (len(tokens), 1))
    positions = np.arange(len(tokens), dtype=np.int32)
    expected = np.asarray(model(mx.array(tokens)[None])[0])
    try:
        for vector in (1, 0):
            decode._lib.attention_mode(vector)
            pools = [np.zeros(p.shape, np.float32) for p in CpuDecode.pool_arrays(storage)]
            logits = decode(tokens, positions, table, pools, pools[0].shape[1], positions)
            np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3, err_msg=f"vector {vector}")
    finally:
        decode._lib.attention_mode(1)


def test_the_last_layer_runs_on_the_logit_rows_only_and_writes_every_rows_kv():
    # A 20-token chunk: logits of every row, of two rows in order (the last layer on those two only),
    # of the same two out of order (every row through the last layer) and of none (K/V only). The
    # K/V pools come out bit for bit the same each time, and the asked rows' logits are MLX's.
    model = tiny_llama()
    storage = tiny_storage(model)
    decode = make_cpu_decode(model, storage)
    assert decode is not None
    tokens = np.array([(11 * i + 5) % 50 for i in range(20)], np.int32)
    table = np.tile(np.arange(5, dtype=np.int32), (len(tokens), 1))
    positions = np.arange(len(tokens), dtype=np.int32)
    expected = np.asarray(model(mx.array(tokens)[None])[0])
    results = {}
    for name, rows in (("all", None), ("two", [3, 19]), ("reversed", [19, 3]), ("none", [])):
        pools = [np.zeros(p.shape, np.float32) for p in CpuDecode.pool_arrays(storage)]
        asked = None if rows is None else np.array(rows, np.int32)
        results[name] = (decode(tokens, positions, table, pools, pools[0].shape[1], asked), pools)
    for name, rows in (("two", [3, 19]), ("reversed", [19, 3])):
        np.testing.assert_allclose(results[name][0], expected[rows], rtol=1e-3, atol=1e-3, err_msg=name)
    assert results["none"][0].shape == (0, expected.shape[1])
    for name in ("two", "reversed", "none"):
        assert all(np.array_equal(a, b) for a, b in zip(results["all"][1], results[name][1])), name


def test_a_second_forward_of_one_shape_reuses_the_measured_direct_rows(monkeypatch):
    monkeypatch.setattr(cpu_decode, "_DIRECT_ROWS", {})
    measured, measure = [], cpu_decode.measure_direct_rows
    monkeypatch.setattr(cpu_decode, "measure_direct_rows", lambda *args: measured.append(1) or measure(*args))
    model = tiny_llama()
    first, second = make_cpu_decode(model, tiny_storage(model)), make_cpu_decode(model, tiny_storage(model))
    assert len(measured) == 1 and (second.direct_min, second.direct_rows) == (
        first.direct_min,
        first.direct_rows,
    )
    wider = tiny_llama(intermediate_size=128)
    make_cpu_decode(wider, tiny_storage(wider))
    assert len(measured) == 2
