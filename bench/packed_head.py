"""The head read as exact 8-bit codes (engine/runner/cpu/exact_pack.py) against read as float32 (with
the bfloat16 screen for greedy rows, cpu_greedy.h), two engines in one process, both with packed layers.

    env -u OPENBLAS_CORETYPE python bench/packed_head.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,4,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--out bench/results/packed_head.json]

Two engines of the README's defaults; in the second the head is put back to its float32 weights after
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

import json
import platform

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.cpu.cpu_decode import CpuDecode
from engine.runner.cpu.matrix import Matrix

from bench.engine_ab import alternate, arguments, closed_loop_report, rows
from bench.gpu import table

MODES = ("packed head", "float32 head")


def with_float32_head(llm: LLMEngine) -> LLMEngine:
    decode = llm.runner.decode
    assert isinstance(decode, CpuDecode), "the C forward serves this model"
    weights = list(decode._matrices)
    head = weights[2]
    assert head.exact and head.source is not None, f"this model's head is not packed: {decode.weight_packing}"
    weights[2] = Matrix((head.source,))
    decode.use_float32(weights)
    return llm


def head_mb(llm: LLMEngine) -> float:
    decode = llm.runner.decode
    return sum(a.nbytes for a in decode._matrices[2].arrays) / 2**20


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/packed_head.json")
    engines = {mode: LLMEngine(EngineConfig(model=args.model)) for mode in MODES}
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
    result = {"args": vars(args), "machine": machine, "head_mb": read, "runs": runs, "closed_loop": closed}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
