"""Many-row float32 products through oneDNN (engine/runner/cpu/onednn.py) against OpenBLAS's sgemm, two
engines in one process.

    env -u OPENBLAS_CORETYPE python bench/onednn.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,4,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--out bench/results/onednn.json]

Two engines of the README's defaults, one with `engine.cpu_onednn` and one without, alternating
(bench/engine_ab.py): per stream count, ms per decode token of one stream, the prefill's ms (every
stream's ~200-token prompt), and whether both engines produced the same tokens. With `--closed-loop N`,
also N clients in a closed loop (bench/engine_ab.py), 3N requests per engine and round. Prints tables
and writes JSON, with what each engine's load-time decision said (`compute.prefill_matmul`).
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

from bench.engine_ab import alternate, arguments, closed_loop_report, rows
from bench.gpu import table

MODES = ("onednn", "sgemm")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/onednn.json")
    engines = {mode: LLMEngine(EngineConfig(model=args.model, cpu_onednn=mode == "onednn")) for mode in MODES}
    decided = {mode: llm.stats().compute.prefill_matmul for mode, llm in engines.items()}
    streams = [int(n) for n in args.streams.split(",")]
    runs = alternate(engines, streams, args.tokens, args.rounds)
    machine = f"{platform.processor() or platform.machine()}, {platform.system()}"
    print(f"\n{args.model} on {machine}; rounds in order")
    for mode, text in decided.items():
        print(f"  {mode}: {text}")
    print()
    table(
        ["streams", "measure", *MODES, "sgemm / oneDNN (medians)", "same tokens"],
        rows(runs, list(MODES), streams),
    )
    closed = closed_loop_report(engines, args, "oneDNN / sgemm (medians)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "machine": machine, "decided": decided, "runs": runs, "closed_loop": closed}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
