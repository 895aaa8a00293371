"""The C forward over int8/int4 pools: it quantizes each new K/V exactly as mx.quantize does, writes what
MLX's paged cache writes for the same tokens, attends over them as MLX's gather path does, and a load
check that fails keeps it out."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import cpu_decode
from engine.runner.cpu.cpu_decode import CForwardDecode, CpuDecode
from engine.runner.fast_path import Target
from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.paged_attention import PagedLayerCache, StepLayout

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from tests.engine.runner.cpu.test_cpu_decode import tiny_llama

BLOCK = 4
NUM_BLOCKS = 12
# head dim 32 (quantized in groups of 32) with 2 queries per K/V head, and head dim 64 (groups of 64)
# with 2 K/V heads of 1 query each.
SHAPES = {"hd32": {"hidden_size": 128}, "hd64": {"hidden_size": 128, "num_attention_heads": 2}}


def quantized(model: nn.Module, dtype: str) -> KVStorage:
    attn = model.model.layers[0].self_attn
    shape = LayerShape(attn.n_kv_heads, attn.head_dim, attn.head_dim)
    return KVStorage([shape] * len(model.model.layers), NUM_BLOCKS, BLOCK, mx.float32, dtype)


def build(model: nn.Module, storage: KVStorage) -> tuple[CpuDecode | None, str | None]:
    target = Target(model, storage, "cpu", None)
    assert CForwardDecode().applies(target) is None
    return CForwardDecode().build(target, {})


def mlx_forward(model: nn.Module, storage: KVStorage, tokens: list[list[int]], starts: list[int], tables):
    """MLX's own forward over the paged caches (the gather path): rows of equal length."""
    layout = StepLayout(starts, len(tokens[0]), tables, BLOCK)
    caches = [PagedLayerCache(storage, i, layout) for i in range(len(storage.shapes))]
    logits = model(mx.array(tokens), cache=caches)[:, -1]
    mx.eval(logits, storage.arrays())
    return np.array(logits)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_kernel_quantizes_bit_for_bit_as_mx_quantize(dtype, shape):
    model = tiny_llama(**SHAPES[shape])
    storage = quantized(model, dtype)
    decode, reason = build(model, storage)
    assert decode is not None, reason
    dim = storage.shapes[0].k_head_dim
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((4000, dim)) * rng.choice([1e-4, 0.1, 1.0, 50.0], (4000, 1))
    # Edge cases: constant vectors (the group's range is 0), zeros, tiny constants, and integers and
    # halves, whose (x - bias) / scale land exactly on .5 ties that rint sends to the even code.
    vectors[:40] = rng.standard_normal((40, 1))
    vectors[40:50], vectors[50:60] = 0.0, 1e-9
    vectors[60:200] = rng.integers(-8, 8, (140, dim)) * rng.choice([0.5, 1.0], (140, 1))
    vectors = vectors.astype(np.float32)
    mine = decode.quantize(vectors)
    theirs = [
        np.array(a) for a in mx.quantize(mx.array(vectors), dim if dim % 64 == 0 else 32, storage.quant.bits)
    ]
    for part, (a, b) in zip(("codes", "scales", "biases"), zip(mine, theirs)):
        assert a.tobytes() == b.tobytes(), f"{part}: {np.count_nonzero(a != b)} differ"


def prefilled_pair(model: nn.Module, dtype: str, tables: list[list[int]], prompts: list[list[int]]):
    """Two storages holding the same prompts, prefilled by MLX (as the engine does before decoding)."""
    storages = [quantized(model, dtype), quantized(model, dtype)]
    for storage in storages:
        for table, prompt in zip(tables, prompts):
            mlx_forward(model, storage, [prompt], [0], [table])
    return storages


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_decode_writes_and_reads_what_mlxs_gather_path_does(dtype):
    model = tiny_llama(**SHAPES["hd32"])
    tables = [[7, 2, 9], [0, 11, 4]]
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    mine, theirs = prefilled_pair(model, dtype, tables, prompts)
    decode, reason = build(model, mine)
    assert decode is not None, reason
    starts = [len(p) for p in prompts]
    for step, tokens in enumerate([[2, 6], [5, 3], [8, 9], [7, 9]]):  # row 1 crosses into its second block
        positions = [s + step for s in starts]
        expected = mlx_forward(model, theirs, [[t] for t in tokens], positions, tables)
        logits = np.array(decode.step(mx.array(tokens), positions, tables))
        assert np.allclose(logits, expected, rtol=0, atol=1e-4 * np.abs(expected).max()), step
    # The same slots hold the same encoding. The quantizer is MLX's bit for bit, but the two paths' K/V
    # differ by summation order, so a scale may differ in its last bits and an element within that noise
    # of a rounding boundary would take the neighbouring code (none does here: all codes are equal).
    for side in ("keys", "values"):
        for layer in range(len(mine.shapes)):
            codes, scales, biases = (
                [np.array(s.side(side)[i][layer]) for s in (mine, theirs)] for i in range(3)
            )
            assert np.array_equal(codes[0], codes[1]), (side, layer)
            assert np.allclose(scales[0], scales[1], rtol=1e-5, atol=0), (side, layer)
            assert np.allclose(biases[0], biases[1], rtol=1e-5, atol=1e-7), (side, layer)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_rows_of_one_sequence_in_one_call_equal_one_call_per_row(dtype):
    """Drafts to verify (engine/spec_decode/) are rows of one sequence at consecutive positions: each
    row's new K/V must be in the pools, quantized, before any row of that layer attends."""
    model = tiny_llama(**SHAPES["hd64"])
    table, prompt, drafts = [5, 1, 8], [4, 4, 2, 7, 1, 3], [6, 2, 9]
    together, apart = prefilled_pair(model, dtype, [table], [prompt])
    decode, reason = build(model, together)
    single, _ = build(model, apart)
    assert decode is not None and single is not None, reason
    # The pools are compared bit for bit, so both sides' products go through the kernel's own matmuls,
    # which sum a row alike at 1 and 3 rows. The load-time measurement may pick OpenBLAS's for either
    # count, and its sgemv and sgemm (at 1 and 3 rows, on some of its cores) sum in different orders.
    for side in (decode, single):
        side.direct_min, side.direct_rows = 1, cpu_decode.MAX_DIRECT
    positions = [len(prompt) + i for i in range(len(drafts))]  # 6, 7, 8: across a block boundary
    joint = np.array(decode.step(mx.array(drafts), positions, [table] * len(drafts)))
    one_by_one = [np.array(single.step(mx.array([t]), [p], [table]))[0] for t, p in zip(drafts, positions)]
    assert np.array_equal(joint, np.stack(one_by_one))
    for a, b in zip(together.arrays(), apart.arrays()):
        assert np.array(a).tobytes() == np.array(b).tobytes()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_chunk_beside_a_row_that_shares_its_first_block_reads_what_one_row_a_call_reads(dtype):
    """A chunk's rows, and beside them a row of another sequence whose table shares only the chunk's
    first block (a cached prefix), each read their own blocks: one call gives what one row a call
    gives, bit for bit."""
    model = tiny_llama(**SHAPES["hd32"])
    chunk_table, other_table = [7, 2, 9], [7, 11, 4]  # block 7: the prefix both prompts share
    together, apart = prefilled_pair(
        model, dtype, [chunk_table, other_table], [[3, 1, 4, 1, 5], [3, 1, 4, 1, 9]]
    )
    decode, reason = build(model, together)
    single, _ = build(model, apart)
    assert decode is not None and single is not None, reason
    for side in (decode, single):
        side.direct_min, side.direct_rows = 1, cpu_decode.MAX_DIRECT
    tokens, positions = [6, 2, 6, 5, 3, 5], [5, 5, 6, 7, 8, 9]  # row 0 the other sequence, 1-5 the chunk
    tables = [other_table] + [chunk_table] * 5
    joint = np.array(decode.step(mx.array(tokens), positions, tables))
    one_by_one = [
        np.array(single.step(mx.array([t]), [p], [tb]))[0] for t, p, tb in zip(tokens, positions, tables)
    ]
    assert np.array_equal(joint, np.stack(one_by_one))
    for a, b in zip(together.arrays(), apart.arrays()):
        assert np.array(a).tobytes() == np.array(b).tobytes()


def test_a_quantized_build_that_disagrees_with_mlx_is_not_used(monkeypatch):
    model = tiny_llama(**SHAPES["hd32"])
    original = CpuDecode.quantize

    def off_by_one(self, vectors):
        codes, scales, biases = original(self, vectors)
        return codes ^ np.uint32(1), scales, biases

    monkeypatch.setattr(CpuDecode, "quantize", off_by_one)
    assert build(model, quantized(model, "int8"))[1] == (
        "its int8 codes, scales or biases differ from mx.quantize's on the load probe"
    )
    monkeypatch.setattr(CpuDecode, "quantize", original)
    # Wrong RoPE: the quantizer still agrees, the logits over the quantized pools do not.
    from engine.runner.cpu import cpu_decode

    sizes = cpu_decode._llama_sizes
    monkeypatch.setattr(cpu_decode, "_llama_sizes", lambda *a: dict(sizes(*a), ROPE_BASE="500.0f"))
    assert build(model, quantized(model, "int4"))[1] == (
        "its logits differ from MLX's gather path over int4 pools on the load probe"
    )


def test_a_quantized_build_that_writes_the_wrong_kv_is_not_used(monkeypatch):
    # The probe's logits bar allows a neighbouring code's worth of difference; the K/V each step writes
    # are checked on their own. Here the kernel's logits are its own, but the scales it leaves behind
    # are tripled: every nonzero code dequantizes more than one code step away from MLX's.
    model = tiny_llama(**SHAPES["hd32"])
    original = CpuDecode.__call__

    def tripled_scales(self, tokens, positions, tables, pools, *rest):
        logits = original(self, tokens, positions, tables, pools, *rest)
        for scales in pools[1::3]:
            for row, pos in enumerate(positions):
                scales[:, tables[row, pos // BLOCK], pos % BLOCK] *= 3
        return logits

    monkeypatch.setattr(CpuDecode, "__call__", tripled_scales)
    assert build(model, quantized(model, "int8"))[1] == (
        "the int8 K/V it writes differ from MLX's gather path's on the load probe"
    )
