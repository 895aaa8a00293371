"""The C forward over quantized weights (MLX's affine 4- and 8-bit codes, read as they are): both of its
matmul paths agree with mx.quantized_matmul at every row count (and over float32 weights with x @ W.T), a prefill chunk run as rows gives MLX's
logits, and the bundled Q4_1 model serves mlx-lm's own greedy tokens with its prefill in the kernel."""

import ctypes
import dataclasses
import platform

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import DEFAULT_MODEL_Q4, EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest
from engine.runner.cpu import cpu_decode
from engine.runner.cpu.cpu_decode import CpuDecode

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from tests.engine.engine_helpers import chat_ids, greedy, reference_greedy, run_to_completion, token_ids
from tests.engine.runner.cpu import test_cpu_decode
from tests.engine.runner.cpu.test_cpu_decode import make_cpu_decode, tiny_llama, tiny_storage

# (bits, group size, hidden, MLP width): every width the kernel reads, each group size it takes; bits 0
# is float32 (the kernel's own matmul for few rows against sgemv/sgemm).
FORMATS = [(4, 32, 64, 96), (8, 64, 128, 192), (4, 128, 128, 256), (8, 32, 64, 96), (0, 0, 64, 100)]


def quantized_llama(bits: int, group: int, hidden: int, width: int, tied: bool = True) -> nn.Module:
    model = tiny_llama(hidden_size=hidden, intermediate_size=width, tie_word_embeddings=tied)
    if bits:
        nn.quantize(model, group_size=group, bits=bits)
    mx.eval(model.parameters())
    return model


def built(model: nn.Module) -> CpuDecode:
    decode = make_cpu_decode(model, tiny_storage(model))
    assert decode is not None, "the load probe accepted the quantized model"
    return decode


def kernel_matmul(decode: CpuDecode, module: nn.Module, x: np.ndarray, mode: int) -> np.ndarray:
    """x @ the module's weight.T through the library's `matmul` (mode 0: its own, 1: OpenBLAS's)."""
    matrix = cpu_decode._matrix(module)
    lib = decode._lib
    lib.matmul.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    pointers = (ctypes.c_void_p * 4)(*matrix.pointers)
    fmt = np.array([matrix.bits, matrix.group], dtype=np.int32)
    (rows, width), out = x.shape, module.weight.shape[0]
    y = np.full((rows, out), np.nan, np.float32)
    assert lib.matmul(pointers, fmt.ctypes.data, x.ctypes.data, y.ctypes.data, rows, out, width, mode) == 0
    return y


@pytest.mark.parametrize(("bits", "group", "hidden", "width"), FORMATS)
def test_both_matmul_paths_equal_mlxs_quantized_matmul(bits, group, hidden, width):
    model = quantized_llama(bits, group, hidden, width)
    decode = built(model)
    proj = model.model.layers[0].mlp.down_proj  # (hidden, width): several groups per row
    # 6 and 13: full float tiles of rows and a part one (tiles of 4 rows with AVX2, 8 with AVX-512)
    for rows in (1, 3, 6, 8, 13, cpu_decode.MAX_DIRECT, 70):
        x = np.random.default_rng(rows).standard_normal((rows, width)).astype(np.float32)
        if bits:
            expected = np.asarray(
                mx.quantized_matmul(mx.array(x), proj.weight, proj.scales, proj.biases, True, group, bits)
            )
        else:  # a width of 100: the kernel's 8-wide loop and its tail; 64 outputs: tiles of 3 and one of 1
            expected = x @ np.asarray(proj.weight).T
        for mode in (0, 1) if rows <= cpu_decode.MAX_DIRECT else (1,):
            y = kernel_matmul(decode, proj, x, mode)
            assert y.shape == (rows, hidden)
            np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4, err_msg=f"{rows} rows, mode {mode}")


def test_two_workers_compute_every_channel_of_a_wide_matmul_once_call_after_call():
    """The work-sharing pool splits a matmul's items in two ranges, and a worker done with its own takes
    from the back of the other's: over many calls (the helper asleep in some, racing in others), every
    output channel comes out, equal to mx.quantized_matmul's."""
    decode = built(quantized_llama(4, 32, 64, 96))
    decode.blas = dataclasses.replace(decode.blas, threads=2)
    decode._configure()
    wide = nn.QuantizedLinear.from_linear(nn.Linear(64, 24 * 41 + 5), group_size=32, bits=4)
    for call in range(60):
        x = np.random.default_rng(call).standard_normal((1 + call % 4, 64)).astype(np.float32)
        expected = np.asarray(
            mx.quantized_matmul(mx.array(x), wide.weight, wide.scales, wide.biases, True, 32, 4)
        )
        y = kernel_matmul(decode, wide, x, 0)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4, err_msg=f"call {call}")


@pytest.mark.parametrize("tied", [True, False])
def test_a_chunk_as_rows_of_one_sequence_gives_mlxs_logits(tied):
    model = quantized_llama(4, 32, 64, 96, tied=tied)
    decode = built(model)
    assert (
        decode.serves_chunks
        and 0 <= decode.direct_rows <= cpu_decode.MAX_DIRECT
        and decode.direct_min in (1, 2)
    )
    storage = tiny_storage(model, block_size=4)
    tokens = [5, 9, 2, 7, 7, 1, 30, 12, 4]  # three blocks, the last one partly filled
    pools = [np.zeros(p.shape, np.float32) for p in CpuDecode.pool_arrays(storage)]
    table = np.array([[2, 0, 5]] * len(tokens), dtype=np.int32)  # blocks out of order
    logit_rows = np.array([8, 3], dtype=np.int32)
    logits = decode(
        np.array(tokens, np.int32), np.arange(len(tokens), dtype=np.int32), table, pools, pools[0].shape[1],
        logit_rows,
    )  # fmt: skip
    expected = np.asarray(model(mx.array([tokens]))[0])[logit_rows]
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3)


@pytest.fixture(scope="module")
def llm_q4() -> LLMEngine:
    # 24-token chunks: the prompts below are prefilled in several chunks, beside other rows' decode.
    return LLMEngine(
        EngineConfig(
            model=DEFAULT_MODEL_Q4, kv_cache_memory_bytes=64 << 20, max_num_seqs=8, max_num_batched_tokens=24
        )
    )


def test_the_bundled_q4_model_prefills_and_decodes_in_the_kernel(llm_q4):
    decode = llm_q4.runner.decode
    assert isinstance(decode, CpuDecode) and decode.serves_chunks
    assert llm_q4.stats().compute.decode == "c_forward"
    head = llm_q4.runner.model.model.embed_tokens
    assert isinstance(head, nn.QuantizedEmbedding) and head.bits == 8  # the GGUF keeps token_embd in Q8_0
    assert llm_q4.runner.model.model.layers[0].mlp.gate_proj.bits == 4


def test_the_bundled_q4_model_samples_mlx_lms_greedy_tokens(llm_q4):
    # mlx-lm's reference runs MLX's CPU quantized matmul, which is slow: two short prompts.
    texts = ["Name a river in France.", "Write a line about rain."]
    prompts = [chat_ids(llm_q4, t) for t in texts]
    calls: list[int] = []
    original = llm_q4.runner.decode.step

    def counting(tokens, starts, tables, logit_rows=None):
        calls.append(len(tokens))
        return original(tokens, starts, tables, logit_rows)

    llm_q4.runner.decode.step = counting  # type: ignore[method-assign]
    try:
        # the second prompt's chunks run beside the first one's decode rows
        arrivals = {2 * i: [GenerateRequest(f"q4-{i}", ids, greedy(8))] for i, ids in enumerate(prompts)}
        outs = run_to_completion(llm_q4, arrivals)
    finally:
        llm_q4.runner.decode.step = original  # type: ignore[method-assign]
    assert max(calls) > 10, "prefill chunks ran in the kernel"
    for i, ids in enumerate(prompts):
        assert token_ids(outs[f"q4-{i}"]) == reference_greedy(llm_q4, ids, 8), texts[i]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 is the baseline -march named here")
def test_the_portable_loops_a_cpu_without_avx2_runs_agree_too(monkeypatch):
    # Built for the x86-64 baseline (SSE2): the scalar loops instead of the AVX2 ones, as an older CPU gets.
    monkeypatch.setenv("MLX_RAY_SERVE_KERNEL_MARCH", "x86-64")
    test_both_matmul_paths_equal_mlxs_quantized_matmul(4, 32, 64, 96)
    test_both_matmul_paths_equal_mlxs_quantized_matmul(8, 64, 128, 192)
    test_both_matmul_paths_equal_mlxs_quantized_matmul(0, 0, 64, 100)
    test_a_chunk_as_rows_of_one_sequence_gives_mlxs_logits(tied=True)
    test_cpu_decode.test_attention_over_every_length_gives_mlxs_logits(block_size=32)


@pytest.mark.skipif(not {"avx2", "fma"} <= set(cpu_decode._cpu_id().split()), reason="needs AVX2 and FMA")
def test_the_avx2_loops_a_cpu_without_avx512_runs_agree_too(monkeypatch):
    # Built for Haswell (AVX2, no AVX-512): 8-float vectors and float tiles of four rows, as an AVX2-only
    # CPU gets them, whichever CPU runs the tests.
    monkeypatch.setenv("MLX_RAY_SERVE_KERNEL_MARCH", "haswell")
    test_both_matmul_paths_equal_mlxs_quantized_matmul(4, 32, 64, 96)
    test_both_matmul_paths_equal_mlxs_quantized_matmul(0, 0, 64, 100)
    test_a_chunk_as_rows_of_one_sequence_gives_mlxs_logits(tied=True)
    test_cpu_decode.test_attention_over_every_length_gives_mlxs_logits(block_size=32)


def test_the_build_key_changes_with_any_header_the_source_includes(tmp_path, monkeypatch):
    for path in [cpu_decode._SOURCE, *cpu_decode._SOURCE.parent.glob("cpu_*.h")]:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(cpu_decode, "_SOURCE", tmp_path / "cpu_decode.c")
    before = cpu_decode.build_key("cc", ["-O3"])
    assert cpu_decode.build_key("cc", ["-O3"]) == before
    with (tmp_path / "cpu_kv.h").open("a") as header:
        header.write("/* changed */\n")
    assert cpu_decode.build_key("cc", ["-O3"]) != before
