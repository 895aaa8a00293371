"""The C forward's weights re-laid on 2 MB pages (engine/runner/cpu/huge_pages.py): the same values,
held once, on the pages the re-layout reports."""

import os
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.runner.cpu import huge_pages
from engine.runner.fast_path import Target

import mlx.core as mx
import numpy as np
import pytest

from tests.engine.runner.cpu.test_cpu_decode import tiny_llama, tiny_storage

pytestmark = pytest.mark.skipif(not huge_pages.supported(), reason="Linux's madvise")


def address(array: mx.array) -> int:
    return np.asarray(array).ctypes.data


def pmd_mapped_bytes(at: int) -> int:
    """AnonHugePages of the mapping that holds address `at`, from /proc/self/smaps."""
    inside = False
    for line in Path(f"/proc/{os.getpid()}/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            first, end = (int(x, 16) for x in head.split("-"))
            inside = first <= at < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {at:#x}")


def test_relaid_arrays_keep_their_values_in_one_aligned_arena():
    rng = np.random.default_rng(0)
    shapes = [(1024, 576), (192, 576), (1536, 576)]  # 6 MB in all: two whole 2 MB pages at least
    originals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    codes = rng.integers(0, 2**32, (64, 72), dtype=np.uint32)
    half = mx.array(rng.standard_normal((8, 8)).astype(np.float16))
    arrays = [*map(mx.array, originals), mx.array(codes), half]
    moved, placed = huge_pages.relay(arrays)
    for before, after in zip([*originals, codes], moved, strict=False):
        assert np.asarray(after).dtype == before.dtype and np.asarray(after).tobytes() == before.tobytes()
    assert moved[-1] is half  # 2-byte elements stay where they are
    starts = [address(a) for a in moved[:4]]
    assert starts[0] % huge_pages.HUGE_PAGE_BYTES == 0
    assert starts == sorted(starts) and starts[-1] - starts[0] < 8 << 20  # one arena, in order
    assert all(s % huge_pages.ALIGN_BYTES == 0 for s in starts)
    assert placed.num_bytes >= sum(a.nbytes for a in arrays[:4])
    # What the re-layout reports is what the kernel maps: 4 MB or more where THP collapses (Linux 6.1
    # and later, THP not "never"), nothing otherwise.
    assert placed.huge_bytes in (0, *range(4 << 20, placed.num_bytes + 1, huge_pages.HUGE_PAGE_BYTES))
    assert pmd_mapped_bytes(starts[0]) >= placed.huge_bytes
    if placed.huge_bytes == 0:
        assert pmd_mapped_bytes(starts[0]) == 0


def test_a_group_past_the_arena_size_starts_another_arena(monkeypatch):
    monkeypatch.setattr(huge_pages, "ARENA_BYTES", 1 << 20)
    originals = [np.full((512, 512), i, np.float32) for i in range(3)]  # 1 MB each: an arena each
    moved, placed = huge_pages.relay(list(map(mx.array, originals)))
    assert [np.asarray(a).tobytes() for a in moved] == [o.tobytes() for o in originals]
    assert all(address(a) % huge_pages.HUGE_PAGE_BYTES == 0 for a in moved)
    assert placed.num_bytes == 3 << 20


def test_the_kernel_reads_the_models_own_relaid_weights():
    from tests.engine.runner.cpu.test_cpu_decode import make_cpu_decode

    model = tiny_llama()
    decode = make_cpu_decode(model, tiny_storage(model))
    assert decode is not None
    embedding = model.model.embed_tokens.weight
    assert address(embedding) % huge_pages.HUGE_PAGE_BYTES == 0  # the first weight of the first arena
    # Held once: the kernel's pointers are the model's arrays.
    assert decode._matrices[0].arrays[0].ctypes.data == address(embedding)
    gate = model.model.layers[1].mlp.gate_proj.weight
    assert address(gate) in {m.arrays[0].ctypes.data for m in decode._matrices}
    assert decode.screen is not None and decode.screen.weights.ctypes.data % huge_pages.HUGE_PAGE_BYTES == 0


def test_off_leaves_the_weights_where_mlx_loaded_them():
    from engine.runner.cpu.cpu_decode import CForwardDecode

    model = tiny_llama()
    mx.eval(model.parameters())
    before = address(model.model.layers[0].self_attn.q_proj.weight)
    target = Target(model, tiny_storage(model), "cpu", None, huge_pages=False)
    decode, refusal = CForwardDecode().build(target, {})
    assert refusal is None and decode is not None
    assert address(model.model.layers[0].self_attn.q_proj.weight) == before
