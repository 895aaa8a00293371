"""Float32 layer weights read in an exact smaller form (engine/runner/cpu/exact_pack.py) against read as
float32, two engines in one process.

    env -u OPENBLAS_CORETYPE python bench/exact_pack.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,4,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--out bench/results/exact_pack.json]

Two engines of the README's defaults, one with `engine.cpu_exact_packing` and one without, alternating
(bench/engine_ab.py): per stream count, ms per decode token of one stream, the prefill's ms (every
stream's ~200-token prompt), and whether both engines produced the same tokens (they must: the packed
weights are the float32 ones, bit for bit). With `--closed-loop N`, also N clients in a closed loop
(bench/engine_ab.py), 3N requests per engine and round. Prints tables and writes JSON.
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

MODES = ("packed", "float32")


def layer_bytes(llm: LLMEngine) -> int:
    """The bytes of the layer weights the C forward reads for a step of few rows."""
    return sum(a.nbytes for m in llm.runner.decode._matrices[3:] for a in m.arrays)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/exact_pack.json")
    engines = {
        mode: LLMEngine(EngineConfig(model=args.model, cpu_exact_packing=mode == "packed")) for mode in MODES
    }
    read = {mode: layer_bytes(llm) / 2**20 for mode, llm in engines.items()}
    note = f"layer weights read {read['packed']:.0f} MB packed, {read['float32']:.0f} MB as float32; rounds in order"
    compare(
        engines, args, note, ("float32 / packed (medians)", "packed / float32 (medians)"), {"layer_mb": read}
    )


if __name__ == "__main__":
    main()
