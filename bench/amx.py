"""Many-row products of exact 4-bit weights on Intel AMX (engine/runner/cpu/amx.py, cpu_amx.h) against
the forward without them (oneDNN's or sgemm's float32 products), two engines in one process.

    env -u OPENBLAS_CORETYPE python bench/amx.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--out bench/results/amx.json]

Two engines of the README's defaults, one with `engine.cpu_amx` and one without, alternating
(bench/engine_ab.py): per stream count, ms per decode token of one stream, the prefill's ms, and
whether both engines produced the same tokens; with `--closed-loop N`, N clients in a closed loop.
First, whole forwards of prefill-sized row counts on scratch pools, the two engines alternating, and
how far their logits lie apart (the largest difference over the row's largest logit). Prints tables and
writes JSON, with what each engine's load-time decisions said (`compute.amx_matmul`,
`compute.prefill_matmul`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.cpu import amx

from bench.engine_ab import arguments, compare
from bench.gpu import table

MODES = ("amx", "without")
FORWARD_ROWS = (64, 128, 256, 512)
FORWARD_REPS = 5


def forwards(engines: dict[str, LLMEngine]) -> list[dict]:
    """Per row count: the fastest whole forward of each engine (alternating), and how far their logits
    lie apart (the largest difference over the row's largest logit)."""
    decodes = {mode: llm.runner.decode for mode, llm in engines.items()}
    if getattr(decodes["amx"], "amx", None) is None:
        return []
    out = []
    for rows in FORWARD_ROWS:
        logits = {mode: d.chunk_logits(rows) for mode, d in decodes.items()}
        timers = {mode: d.scratch_forward(rows) for mode, d in decodes.items()}
        best = dict.fromkeys(MODES, float("inf"))
        for _ in range(FORWARD_REPS):
            for mode in MODES:
                best[mode] = min(best[mode], timers[mode](decodes[mode].direct_rows))
        difference = amx.agreement(logits["without"], logits["amx"])
        out.append(
            {"rows": rows, **{f"{m}_ms": best[m] * 1e3 for m in MODES}, "logit_difference": difference}
        )
    return out


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/amx.json")
    engines = {mode: LLMEngine(EngineConfig(model=args.model, cpu_amx=mode == "amx")) for mode in MODES}
    decided = {
        mode: {
            "amx_matmul": llm.stats().compute.amx_matmul,
            "prefill_matmul": llm.stats().compute.prefill_matmul,
        }
        for mode, llm in engines.items()
    }
    timed = forwards(engines)
    if timed:
        print("\nWhole forwards on scratch pools (fastest of 5, alternating)\n")
        rows = [
            [t["rows"], f"{t['amx_ms']:.1f}", f"{t['without_ms']:.1f}", f"{t['without_ms'] / t['amx_ms']:.2f}x",
             f"{t['logit_difference']:.1e}"]
            for t in timed
        ]  # fmt: skip
        table(["rows", "AMX ms", "without ms", "speed-up", "largest logit difference / row scale"], rows)
    note = "rounds in order" + "".join(
        f"\n  {mode}: {said['amx_matmul']}\n    prefill products: {said['prefill_matmul']}"
        for mode, said in decided.items()
    )
    compare(
        engines,
        args,
        note,
        ("without / AMX (medians)", "AMX / without (medians)"),
        {"decided": decided, "forwards": timed},
    )


if __name__ == "__main__":
    main()
