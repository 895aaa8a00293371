"""The C forward's many-row products through oneDNN (engine/runner/cpu/onednn.py, onednn.c): forwards of
every row count past the own matmuls give sgemm's tokens with logits within float32 rounding, through
oneDNN's calls (counted); the load-time decision keeps it only where it is as close and faster; a
missing install or `engine.cpu_onednn: false` leaves sgemm, saying why."""

import ctypes
import gc
import os
import subprocess
import sys

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import onednn
from engine.runner.cpu.cpu_decode import MAX_DIRECT, CForwardDecode, CpuDecode
from engine.runner.fast_path import Target

import numpy as np
import pytest

from tests.engine.runner.cpu.test_cpu_decode import tiny_llama, tiny_storage

pytestmark = pytest.mark.skipif(onednn.unavailable() is not None, reason=str(onednn.unavailable()))


def built(model, use_onednn: bool = True) -> CpuDecode:
    target = Target(model, tiny_storage(model), "cpu", None, onednn=use_onednn)
    decode = CForwardDecode().build(target, {})[0]
    assert decode is not None, "the load probe accepted the model"
    return decode


def calls(decode: CpuDecode) -> int:
    assert decode.onednn is not None
    decode.onednn.lib.onednn_calls.restype = ctypes.c_long
    return decode.onednn.lib.onednn_calls()


def items(packed: onednn.OneDnn, handle: int, rows: int, threads: int) -> int:
    """The calls one product of `rows` rows makes (cpu_matmul.h's onednn_linear): its weight's channel
    blocks times row blocks of at most 256 rows, at least two items a worker where 16-row blocks allow."""
    packed.lib.onednn_blocks.argtypes = [ctypes.c_void_p]
    blocks, row_blocks = packed.lib.onednn_blocks(handle), -(-rows // 256)
    while row_blocks * blocks < 2 * min(threads, 2) and rows // (row_blocks + 1) >= 16:
        row_blocks += 1
    per = -(-rows // row_blocks)
    return blocks * -(-rows // per)


# Past the own matmuls (at most MAX_DIRECT rows): two blocks of one row count, uneven blocks, one
# block of 64 rows per worker, and more blocks than workers.
ROWS = (MAX_DIRECT + 1, 50, 64, 65, 129, 300)


def test_every_row_split_gives_sgemms_tokens_through_onednn_calls():
    model = tiny_llama(hidden_size=128, intermediate_size=320, vocab_size=300)
    decode = built(model)
    packed = decode.onednn or onednn.pack(decode.matrices)  # this machine may have timed sgemm faster
    assert isinstance(packed, onednn.OneDnn) and packed.nbytes >= sum(
        m.arrays[0].nbytes for m in decode.matrices[3:] if m.bits == 0 and m.arrays[0].ndim == 2
    )
    for rows in ROWS:
        decode.onednn = None
        sgemm = decode.chunk_logits(rows)
        decode.onednn = packed
        before = calls(decode)
        through = decode.chunk_logits(rows)
        assert calls(decode) - before == sum(
            items(packed, h, rows, decode.blas.threads) for h in packed.handles if h
        )
        assert onednn.close_logits(sgemm, through), rows


def test_packed_copies_are_freed_with_their_forward():
    decode = built(tiny_llama())
    packed = onednn.pack(decode.matrices)
    assert isinstance(packed, onednn.OneDnn)
    lib, count = packed.lib, sum(1 for h in packed.handles if h)
    lib.onednn_live.restype = ctypes.c_long
    before = lib.onednn_live()
    del packed
    gc.collect()
    assert lib.onednn_live() == before - count
    assert count == 7 * len(decode.matrices[3:]) // 9  # seven products a layer (nine weights)


def test_the_status_says_which_product_the_forward_takes():
    model = tiny_llama()
    decode = built(model)
    assert decode.prefill_matmul.startswith(("oneDNN ", "sgemm (oneDNN slower here: 64 rows"))
    assert built(model, use_onednn=False).prefill_matmul == "sgemm (engine.cpu_onednn is false)"


@pytest.mark.parametrize("faster", [True, False])
def test_onednn_is_kept_only_where_the_timed_forwards_are_faster(faster, monkeypatch):
    fast, slow = [0.01, 0.05], [0.02, 0.09]
    monkeypatch.setattr(onednn, "_TIMINGS", {})  # no earlier load's timings
    monkeypatch.setattr(
        onednn,
        "time_modes",
        lambda *_: {"onednn": fast, "sgemm": slow} if faster else {"onednn": slow, "sgemm": fast},
    )
    decode = built(tiny_llama())
    assert (decode.onednn is not None) == faster
    expected = (
        "oneDNN " if faster else "sgemm (oneDNN slower here: 64 rows 20.0 against 10.0 ms, 256 rows 90.0"
    )
    assert decode.prefill_matmul.startswith(expected)


def test_a_second_forward_of_one_shape_reuses_the_first_ones_timings(monkeypatch):
    monkeypatch.setattr(onednn, "_TIMINGS", {})
    timed, time_modes = [], onednn.time_modes
    monkeypatch.setattr(onednn, "time_modes", lambda *args: timed.append(1) or time_modes(*args))
    first, second = built(tiny_llama()), built(tiny_llama())  # a second load of one model
    assert len(timed) == 1 and second.prefill_matmul == first.prefill_matmul
    built(tiny_llama(intermediate_size=128))  # another shape: timed anew
    assert len(timed) == 2


def test_differing_logits_at_load_leave_sgemm(monkeypatch):
    monkeypatch.setattr(onednn, "close_logits", lambda *_: False)
    decode = built(tiny_llama())
    assert decode.onednn is None
    assert decode.prefill_matmul == "sgemm (oneDNN's logits differed from sgemm's at load)"


def test_copies_past_the_memory_share_leave_sgemm(monkeypatch):
    monkeypatch.setattr(onednn.exact_pack, "memory_budget", lambda: 1000)
    decode = built(tiny_llama())
    assert decode.onednn is None
    assert decode.prefill_matmul.startswith("sgemm (oneDNN's copies (")


def test_without_onednn_installed_the_forward_keeps_sgemm(monkeypatch):
    monkeypatch.setattr(onednn, "_library_path", lambda: None)
    decode = built(tiny_llama())
    assert decode.onednn is None
    assert (
        decode.prefill_matmul
        == "sgemm (oneDNN is not installed (pip install onednn-cpu-gomp onednn-devel-cpu-gomp))"
    )


def test_close_logits_wants_the_same_tokens_within_rounding():
    first = np.array([[1.0, 3.0, -2.0], [0.5, 0.25, 0.0]], np.float32)
    assert onednn.close_logits(first, first + 1e-6)
    assert not onednn.close_logits(first, first + np.float32(0.01))  # past 1e-3 of the row's largest
    swapped, near = first.copy(), first.copy()
    swapped[1], near[1] = [0.2500002, 0.2500001, 0.0], [0.25, 0.2500001, 0.0]  # close, another token wins
    assert not onednn.close_logits(swapped, near)
    assert not onednn.close_logits(first, np.where(first > 2, np.nan, first))


@pytest.mark.parametrize(("limit", "isa"), [("AVX2", "avx2"), ("SSE41", "sse4.1")])
def test_older_cpus_kernels_give_the_same_tokens(limit, isa):
    """oneDNN picks its kernels for the CPU at run time: held to AVX2 (a machine without AVX-512) or
    SSE4.1, a forward of 129 rows still gives sgemm's tokens. A process of its own: oneDNN reads the
    limit once."""
    script = (
        "import engine\n"
        "from tests.engine.runner.cpu.test_onednn import built, tiny_llama\n"
        "from engine.runner.cpu import onednn\n"
        "decode = built(tiny_llama(hidden_size=128, intermediate_size=320))\n"
        "packed = decode.onednn or onednn.pack(decode.matrices)\n"
        "assert isinstance(packed, onednn.OneDnn), packed\n"
        "decode.onednn = None\n"
        "sgemm = decode.chunk_logits(129)\n"
        "decode.onednn = packed\n"
        "assert onednn.close_logits(sgemm, decode.chunk_logits(129))\n"
        "print(packed.impl)\n"
    )
    env = os.environ | {"ONEDNN_MAX_CPU_ISA": limit}
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(f" for {isa}"), done.stdout
