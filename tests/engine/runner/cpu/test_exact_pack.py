"""Float32 head and layer weights kept in a form that holds them exactly (engine/runner/cpu/exact_pack.py,
cpu_pack.h): 4-bit affine groups, signed 8-bit groups and bfloat16 words are found, expanded back bit
for bit, and give the float32 weights' logits bit for bit at every position; weights no such form holds
stay float32, and a packing whose logits differ is dropped."""

import logging
import platform
from collections import Counter

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import cpu_decode, exact_pack
from engine.runner.cpu.cpu_decode import CForwardDecode, CpuDecode
from engine.runner.fast_path import Target

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from tests.engine.runner.cpu.test_cpu_decode import tiny_llama, tiny_storage

AVX2 = {"avx2", "fma"} <= set(cpu_decode._cpu_id().split())


def layer_linears(model: nn.Module) -> list[nn.Linear]:
    return [m for layer in model.model.layers for m in cpu_decode._projections(layer)]


def affine_exact_llama(**overrides) -> nn.Module:
    """A tiny Llama (tiny_llama's, with `overrides`) whose projections are 4-bit codes times a float16
    scale plus a float16 bias per 32 weights, in float32, each group from code 0 to code 15: what a
    GGUF Q4_1 model dequantized to float32 holds."""
    model, rng = tiny_llama(**overrides), np.random.default_rng(5)
    for linear in layer_linears(model):
        out, width = linear.weight.shape
        codes = rng.integers(0, 16, (out, width // 32, 32)).astype(np.float32)
        codes[..., 7], codes[..., 20] = 0, 15  # a group's ends, as a quantizer places them
        scales = rng.uniform(0.002, 0.05, (out, width // 32, 1)).astype(np.float16).astype(np.float32)
        biases = rng.uniform(-0.4, 0.0, (out, width // 32, 1)).astype(np.float16).astype(np.float32)
        linear.weight = mx.array((codes * scales + biases).reshape(out, width))
    mx.eval(model.parameters())
    return model


def q8_exact_llama() -> nn.Module:
    """A tiny Llama whose head and projections are signed 8-bit codes times a float16 scale per 32
    weights, in float32: what GGUF's Q8_0 dequantized holds (llama.cpp's 8-bit quantization, and the
    bundled model's embedding and head)."""
    model, rng = tiny_llama(), np.random.default_rng(8)
    for linear in [*layer_linears(model), model.lm_head]:
        out, width = linear.weight.shape
        codes = rng.integers(-127, 128, (out, width // 32, 32)).astype(np.float32)
        codes[..., 11] = rng.choice([-127, 127], (out, width // 32))  # the group's largest magnitude
        scales = rng.uniform(0.0005, 0.02, (out, width // 32, 1)).astype(np.float16).astype(np.float32)
        linear.weight = mx.array((codes * scales).reshape(out, width))
    mx.eval(model.parameters())
    return model


def bfloat16_llama() -> nn.Module:
    model = tiny_llama()
    model.set_dtype(mx.bfloat16)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def built(model: nn.Module, packing: bool) -> CpuDecode:
    target = Target(model, tiny_storage(model), "cpu", None, exact_packing=packing)
    decode = CForwardDecode().build(target, {})[0]
    assert decode is not None, "the load probe accepted the model"
    return decode


def packed_bits(decode: CpuDecode) -> set[int]:
    """The packings of the head and the layers."""
    return {m.bits for m in decode._matrices[2:] if m.exact}


def sequence_logits(decode: CpuDecode, model: nn.Module) -> np.ndarray:
    """Logits of a 13-token prefill chunk (rows of one sequence over four 4-token blocks), then of one
    decode row after it, on pools of their own."""
    storage = tiny_storage(model)
    pools = [np.zeros(np.asarray(a).shape, np.float32) for a in decode.pool_arrays(storage)]
    blocks = storage.keys[0].shape[1]
    tokens = np.array([3, 17, 9, 44, 1, 0, 23, 23, 8, 31, 2, 49, 12], dtype=np.int32)
    table = np.tile(np.array([5, 2, 7, 0], dtype=np.int32), (len(tokens), 1))
    chunk = decode(tokens, np.arange(len(tokens), dtype=np.int32), table, pools, blocks)
    row = decode(np.array([6], np.int32), np.array([len(tokens)], np.int32), table[:1], pools, blocks)
    return np.concatenate([chunk, row])


# The CPUs the kernel is built for: this one; Haswell (AVX2, no AVX-512: expanded tiles, not the
# register tables); the x86-64 baseline (SSE2: the scalar loops).
MARCHES = [
    None,
    pytest.param("haswell", marks=pytest.mark.skipif(not AVX2, reason="needs AVX2 and FMA")),
    pytest.param("x86-64", marks=pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 only")),
]


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize(
    ("make", "bits"), [(affine_exact_llama, {4}), (q8_exact_llama, {8}), (bfloat16_llama, {16})]
)
def test_packed_weights_give_the_float32_logits_bit_for_bit(make, bits, march, monkeypatch):
    if march:
        monkeypatch.setenv("MLX_RAY_SERVE_KERNEL_MARCH", march)
    model = make()
    packed, plain = built(model, packing=True), built(model, packing=False)
    assert packed_bits(packed) == bits and all(m.exact for m in packed._matrices[3:] if m.bits)
    assert packed._matrices[2].exact == (make is not affine_exact_llama)  # its head: random floats
    assert packed.screen is None or not packed._matrices[2].exact  # a packed head reads fewer bytes
    assert not packed_bits(plain)
    floats = [cpu_decode.Matrix((m.source,)) if m.exact else m for m in packed._matrices]
    assert sum(a.nbytes for m in packed._matrices[2:] for a in m.arrays) < sum(
        a.nbytes for m in floats[2:] for a in m.arrays
    )
    # One decoder, its direct-row settings kept (measured per instance), the weights swapped.
    first = sequence_logits(packed, model)
    packed._use(floats)
    second = sequence_logits(packed, model)
    assert np.isfinite(first).all()
    assert np.array_equal(first.view(np.uint32), second.view(np.uint32))


def test_float32_weights_no_smaller_form_holds_stay_as_they_are():
    model = tiny_llama()  # random float32 weights
    decode = built(model, packing=True)
    assert not packed_bits(decode)
    packing = exact_pack.pack(decode._lib, decode._matrices)
    assert not packing.packed and packing.kinds == Counter({"float32": len(layer_linears(model)) + 1})
    assert decode.weight_packing.startswith("off (no layer weight")
    assert built(model, packing=False).weight_packing == "off (engine.cpu_exact_packing is false)"
    assert packing.weights == decode._matrices


def test_packed_copies_stay_within_the_memory_budget():
    model = affine_exact_llama()
    decode = built(model, packing=False)
    weights = decode._matrices
    sizes = [exact_pack._smallest(m) for m in weights[2:] if m.arrays[0].ndim == 2]
    packing = exact_pack.pack(decode._lib, weights, budget=3 * max(sizes))
    packed = [m for m in packing.weights if m.exact]
    assert packing.packed and 0 < len(packed) < len(sizes)
    assert sum(a.nbytes for m in packed for a in m.arrays) <= 3 * max(sizes)
    assert packing.kinds["float32, no room"] + packing.kinds["float32"] == len(sizes) - len(packed)
    assert not exact_pack.pack(decode._lib, weights, budget=0).packed
    assert exact_pack.memory_budget() > 0


def test_one_weight_a_unit_in_the_last_place_off_is_not_packed():
    model = affine_exact_llama()
    decode = built(model, packing=False)
    matrix = cpu_decode._matrix(layer_linears(model)[0])
    assert exact_pack._packed(decode._lib, matrix) is not None
    weight = matrix.arrays[0].copy()
    weight[3, 40] = np.nextafter(weight[3, 40], np.float32(1))
    assert exact_pack._packed(decode._lib, cpu_decode.Matrix((weight,))) is None


def test_an_expansion_that_misses_a_row_is_caught():
    model = affine_exact_llama()
    decode = built(model, packing=False)
    matrix = cpu_decode._matrix(layer_linears(model)[0])
    packed = exact_pack._packed(decode._lib, matrix)
    assert packed is not None and exact_pack._mismatches(decode._lib, packed, matrix.arrays[0]) == 0
    packed.arrays[0][2, 1] ^= 0x10  # one code of row 2
    assert exact_pack._mismatches(decode._lib, packed, matrix.arrays[0]) == 1


def test_a_packing_whose_logits_differ_is_dropped(monkeypatch, caplog):
    monkeypatch.setattr(CpuDecode, "same_logits", lambda *_: False)
    with caplog.at_level(logging.WARNING, logger=cpu_decode.__name__):
        decode = built(affine_exact_llama(), packing=True)
    assert not packed_bits(decode) and "changed the logits" in caplog.text
    assert decode.weight_packing.startswith("off (the packed weights' logits differed")


def test_one_code_of_an_8_bit_group_off_is_caught():
    model = q8_exact_llama()
    decode = built(model, packing=False)
    matrix = cpu_decode._matrix(model.lm_head)
    packed = exact_pack._packed(decode._lib, matrix)
    assert packed is not None and packed.bits == 8
    assert exact_pack._mismatches(decode._lib, packed, matrix.arrays[0]) == 0
    packed.arrays[0][4, 3] ^= 0x100  # one code of row 4 (byte 1 of word 3)
    assert exact_pack._mismatches(decode._lib, packed, matrix.arrays[0]) == 1


def test_the_bundled_model_reads_its_layers_as_4_bit_codes_and_its_head_as_8_bit_ones(llm):
    # Its float32 weights are llama.cpp's Q4_1 (layers) and Q8_0 (the embedding, tied to the head)
    # dequantized; the engine's greedy tests run on them.
    decode = llm.runner.decode
    assert isinstance(decode, CpuDecode) and packed_bits(decode) == {4, 8} and decode._matrices[2].bits == 8
    packing = "head and layer weights 4-bit affine 210, 8-bit 1; 513 MB read as 106 MB"
    assert llm.stats().compute.weight_packing == packing
