"""The head read as exact 8-bit codes (engine/runner/cpu/exact_pack.py) against read as float32 (with
the bfloat16 screen for greedy rows, cpu_greedy.h), two engines in one process, both with packed layers.

    env -u OPENBLAS_CORETYPE python bench/packed_head.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,4,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--matmul-rows 1,2,4,8,16]
        [--out bench/results/packed_head.json]

First the head's matmul alone (the kernel's `matmul` export, the own matmuls), packed against float32,
alternating, at each of `--matmul-rows` (median of 25, ms). Then two engines of the README's defaults; in
the second the head is put back to its float32 weights after
load, as a load without the head's packing would have it (CpuDecode.use_float32: direct rows measured
again, the screen built). Alternating (bench/engine_ab.py): per stream count, ms per decode token of one
stream, the prefill's ms, and whether both engines produced the same tokens (they must: the codes give
the float32 weights back bit for bit). With `--closed-loop N`, also N clients in a closed loop. Prints
tables and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import ctypes
import json
import platform
import statistics
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.cpu.matrix import Matrix

import numpy as np

from bench.engine_ab import alternate, arguments, closed_loop_report, rows
from bench.gpu import table
from bench.greedy_screen import with_float32_head

MODES = ("packed head", "float32 head")


def head_mb(llm: LLMEngine) -> float:
    decode = llm.runner.decode
    return sum(a.nbytes for a in decode._matrices[2].arrays) / 2**20


def head_matmul_ms(llm: LLMEngine, rows_list: list[int], reps: int = 25) -> dict[int, dict[str, float]]:
    """{rows: {mode: median ms}} of the head's matmul alone through the own matmuls, packed and float32
    alternating; asserts that both give the same bits."""
    decode = llm.runner.decode
    lib, head = decode._lib, decode._matrices[2]
    lib.matmul.restype = ctypes.c_int
    lib.matmul.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    decode._configure()
    forms = {MODES[0]: head, MODES[1]: Matrix((head.source,))}
    out, inputs = head.shape
    cells = {}
    for n in rows_list:
        x = np.random.default_rng(n).standard_normal((n, inputs)).astype(np.float32)
        ys = {mode: np.empty((n, out), np.float32) for mode in MODES}
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(reps):
            for mode, matrix in forms.items():
                pointers = (ctypes.c_void_p * 4)(*matrix.pointers)
                formats = np.array(matrix.format, np.int32)
                start = time.perf_counter()
                lib.matmul(
                    pointers, formats.ctypes.data, x.ctypes.data, ys[mode].ctypes.data, n, out, inputs, 0
                )
                times[mode].append((time.perf_counter() - start) * 1000)
        assert np.array_equal(ys[MODES[0]].view(np.uint32), ys[MODES[1]].view(np.uint32)), n
        cells[n] = {mode: statistics.median(ms) for mode, ms in times.items()}
    return cells


def main() -> None:
    args = arguments(
        __doc__.splitlines()[0],
        "bench/results/packed_head.json",
        {"--matmul-rows": "1,2,4,8,16"},
    )
    engines = {mode: LLMEngine(EngineConfig(model=args.model)) for mode in MODES}
    matmul_rows = [int(n) for n in args.matmul_rows.split(",")]
    matmul = head_matmul_ms(engines[MODES[0]], matmul_rows)
    print("\nthe head's matmul alone, ms (median of 25, alternating)\n")
    table(
        ["rows", *MODES, "float32 / packed"],
        [
            [n, *(f"{c[m]:.2f}" for m in MODES), f"{c[MODES[1]] / c[MODES[0]]:.2f}x"]
            for n, c in matmul.items()
        ],
    )
    with_float32_head(engines[MODES[1]])
    read = {mode: head_mb(llm) for mode, llm in engines.items()}
    streams = [int(n) for n in args.streams.split(",")]
    runs = alternate(engines, streams, args.tokens, args.rounds)
    machine = f"{platform.processor() or platform.machine()}, {platform.system()}"
    screened = engines[MODES[1]].runner.decode.screen is not None
    print(f"\n{args.model} on {machine}; the head read {read[MODES[0]]:.0f} MB packed, "
          f"{read[MODES[1]]:.0f} MB as float32 (greedy rows screened: {screened}); rounds in order\n")  # fmt: skip
    table(
        ["streams", "measure", *MODES, "float32 / packed (medians)", "same tokens"],
        rows(runs, list(MODES), streams),
    )
    closed = closed_loop_report(engines, args, "packed / float32 (medians)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "machine": machine, "head_mb": read, "head_matmul_ms": matmul}
    result |= {"runs": runs, "closed_loop": closed}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
