"""Products of exact 4-bit weights on Intel AMX (engine/runner/cpu/amx.py, cpu_amx.h): one product,
through the 32-row kernel and the few-row one, is the float32 weights' product within float32
rounding; forwards of every row split give the same tokens as without it, through its products
(counted); the load keeps each kernel only where it agrees and is faster, and frees oneDNN's copies of
the weights prefill takes to it; without AMX, or with `engine.cpu_amx: false`, it is off and says why."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import amx, onednn
from engine.runner.cpu.cpu_decode import MAX_DIRECT, CForwardDecode, CpuDecode
from engine.runner.fast_path import Target

import numpy as np
import pytest
from mlx import nn

from tests.engine.runner.cpu.test_cpu_decode import tiny_llama, tiny_storage
from tests.engine.runner.cpu.test_exact_pack import affine_exact_llama


def built(model: nn.Module, use_amx: bool = True, march: str | None = None, monkeypatch=None) -> CpuDecode:
    if march:
        monkeypatch.setenv("MLX_RAY_SERVE_KERNEL_MARCH", march)
    target = Target(model, tiny_storage(model), "cpu", None, amx=use_amx)
    decode = CForwardDecode().build(target, {})[0]
    assert decode is not None, "the load probe accepted the model"
    return decode


@pytest.fixture(scope="module")
def model() -> nn.Module:
    # every projection's outputs a multiple of 64, as the few-row kernel takes them (q 128, k and v 64,
    # gate and up 192, o and down 128)
    return affine_exact_llama(hidden_size=128, intermediate_size=192)


@pytest.fixture(scope="module")
def decode(model) -> CpuDecode:
    return built(model)


def supported(decode: CpuDecode) -> bool:
    amx.declare(decode.library)
    return bool(decode.library.amx_supported())


needs_amx = pytest.mark.usefixtures("require_amx")


@pytest.fixture
def require_amx(decode):
    if not supported(decode):
        pytest.skip("this CPU has no AMX-BF16 (or the OS does not let the process use it)")


def packed(decode: CpuDecode) -> amx.Amx:
    copies = decode.amx or amx.pack(decode.library, decode.matrices)  # this machine may have timed it slower
    assert isinstance(copies, amx.Amx)
    return copies


@needs_amx
def test_one_product_is_the_float32_weights_product_within_float32_rounding(decode):
    lib, copies = decode.library, packed(decode)
    index = next(i for i, h in enumerate(copies.handles) if h)
    matrix = decode.matrices[index]
    weights = matrix.source.astype(np.float64)  # the float32 weights the codes hold exactly
    biases = np.repeat(matrix.arrays[2].astype(np.float64), 32, axis=1)
    out, width = weights.shape
    rng = np.random.default_rng(7)
    cases = [(rows, False) for rows in (1, 31, 32, 33, 70)] + [(rows, True) for rows in (1, 5, 16)]
    for rows, few in cases:
        scale = rng.choice([1e-3, 1.0, 50.0], (rows, 1))  # rows of different sizes
        x = (rng.standard_normal((rows, width)) * scale).astype(np.float32)
        x[0, :5] = [0.0, 1e-30, -3.4e4, 1.0 + 2**-23, -(2**-20)]  # zero, tiny, large, full 24-bit values
        y = np.full((rows, out), np.nan, np.float32)
        assert lib.amx_multiply(copies.handles[index], x.ctypes.data, y.ctypes.data, rows, int(few)) == 0
        exact = x.astype(np.float64) @ weights.T
        # The product is computed as scale * sum(code * x) + bias * sum(x) per group, in float32: each
        # sum within (terms) * 2^-24 of the sum of its terms' magnitudes, |w - bias| and |bias| a weight.
        parts = np.abs(weights - biases) + np.abs(biases)
        bound = 2 * (3 * 32 + width) * 2.0**-24 * (np.abs(x).astype(np.float64) @ parts.T) + 1e-30
        assert (np.abs(y - exact) <= bound).all(), (rows, few)
    x = np.ones((17, width), np.float32)
    assert lib.amx_multiply(copies.handles[index], x.ctypes.data, y.ctypes.data, 17, 1) == -1  # one tile: 16


# Past the own matmuls (at most MAX_DIRECT rows): one short row tile, whole tiles, tiles and a short
# one, more tiles than two workers.
ROWS = (MAX_DIRECT + 1, 50, 64, 65, 129, 300)


def use(decode: CpuDecode, copies: amx.Amx | None, many: bool = True, few_min: int = amx.NEVER) -> None:
    decode.amx, decode.amx_many, decode.amx_few_min = copies, many, few_min


def through_amx(decode: CpuDecode, copies: amx.Amx, rows: int, few_min: int = amx.NEVER) -> int:
    """Forwards `rows` rows with and without AMX: asserts the same tokens, returns AMX's products."""
    kept = decode.amx, decode.amx_many, decode.amx_few_min
    try:
        use(decode, None)
        without = decode.chunk_logits(rows)
        use(decode, copies, True, few_min)
        before = amx.products(decode.library)
        through = decode.chunk_logits(rows)
        assert onednn.close_logits(without, through), rows
        if amx.products(decode.library) > before:
            assert not np.array_equal(without, through), "the products are AMX's, not the float32 path's"
        return amx.products(decode.library) - before
    finally:
        use(decode, *kept)


@needs_amx
def test_every_row_split_gives_the_same_tokens_through_amx_products(decode):
    copies = packed(decode)
    products = sum(1 for h in copies.handles if h)
    assert products == 7 * len(decode.matrices[3:]) // 9  # every projection of every layer
    for rows in ROWS:
        assert through_amx(decode, copies, rows) == products, rows
    # Decode rows (those the own matmuls take: all up to MAX_DIRECT here, whatever this machine
    # measured for the tiny weights) go to the few-row kernel from few_min to 16 rows only.
    kept = decode.direct_min, decode.direct_rows
    decode.direct_min, decode.direct_rows = 1, MAX_DIRECT
    try:
        for rows in (1, 2, 7, 16, 17):
            assert through_amx(decode, copies, rows, few_min=2) == (products if 2 <= rows <= 16 else 0), rows
        assert through_amx(decode, copies, 16) == 0  # few_min NEVER: the own matmuls
    finally:
        decode.direct_min, decode.direct_rows = kept


@needs_amx
def test_the_load_keeps_what_agrees_and_is_faster_and_frees_onednns_copies_of_what_prefill_takes(decode):
    said = decode.amx_matmul
    if decode.amx is None:
        assert said.startswith("off (slower here: prefill 64 rows"), said
        return
    assert said.startswith(f"AMX bfloat16 x3 over {decode.amx.products} 4-bit products ("), said
    assert ("; decode steps of " in said) == (decode.amx_few_min != amx.NEVER)
    assert decode.amx_few_min == amx.NEVER or decode.amx_few_min in amx.FEW_ROWS
    assert (": prefill (" in said) == decode.amx_many
    if decode.onednn is not None and decode.amx_many:
        assert all(not decode.onednn.handles[i] for i, h in enumerate(decode.amx.handles) if h)
        assert decode.prefill_matmul.endswith("of its weights on AMX instead, their copies freed")


@needs_amx
def test_logits_that_differ_turn_it_off(model, monkeypatch):
    monkeypatch.setattr(onednn, "close_logits", lambda first, second: False)
    decode = built(model)
    assert decode.amx is None and decode.amx_matmul == "off (the AMX products' logits differed at load)"


@needs_amx
def test_copies_past_the_memory_budget_are_not_made(decode, monkeypatch):
    monkeypatch.setattr(amx.exact_pack, "memory_budget", lambda: 1000)
    said = amx.pack(decode.library, decode.matrices)
    assert (
        isinstance(said, str) and said.startswith("off (AMX's copies (") and "quarter of the memory" in said
    )


def test_float32_weights_that_no_4_bit_group_holds_have_no_copies():
    decode = built(tiny_llama())
    assert decode.amx is None
    assert decode.amx_matmul in (
        "off (no layer weight is held as exact 4-bit codes)",
        "off (this CPU has no AMX-BF16, or the OS does not let the process use it)",
    )


def test_a_build_for_a_cpu_without_amx_says_so(model, monkeypatch):
    decode = built(model, march="x86-64", monkeypatch=monkeypatch)
    assert decode.amx is None
    assert decode.amx_matmul == "off (this CPU has no AMX-BF16, or the OS does not let the process use it)"


def test_the_setting_turns_it_off(model):
    decode = built(model, use_amx=False)
    assert decode.amx is None and decode.amx_matmul == "off (engine.cpu_amx is false)"
