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

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

from bench.engine_ab import arguments, compare

MODES = ("onednn", "sgemm")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/onednn.json")
    engines = {mode: LLMEngine(EngineConfig(model=args.model, cpu_onednn=mode == "onednn")) for mode in MODES}
    decided = {mode: llm.stats().compute.prefill_matmul for mode, llm in engines.items()}
    note = "rounds in order" + "".join(f"\n  {mode}: {text}" for mode, text in decided.items())
    compare(
        engines, args, note, ("sgemm / oneDNN (medians)", "oneDNN / sgemm (medians)"), {"decided": decided}
    )


if __name__ == "__main__":
    main()
