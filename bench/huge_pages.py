"""The C forward's weights on 2 MB pages against where MLX loaded them, two engines in one process.

    env -u OPENBLAS_CORETYPE python bench/huge_pages.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,4,16] [--tokens 96] [--rounds 3] [--out bench/results/huge_pages.json]

Two engines of the README's defaults, one with `engine.cpu_huge_pages` (engine/runner/cpu/huge_pages.py)
and one without; each round runs every stream count on both, alternating which goes first, so a slow
moment of the machine slows both. Per run: the prefill (every stream's ~200-token prompt, until each
has its first token; each round's prompts are new to the prefix cache), ms per decode token per stream
(from then to the last token), and whether both engines produced the same tokens. Prints a table and
writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import os
import platform
import statistics

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

from bench.gpu import table
from bench.greedy_screen import decode

MODES = ("huge pages", "as loaded")


def huge_bytes() -> int:
    """This process's anonymous memory on 2 MB pages."""
    line = next(
        s for s in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines() if "AnonHuge" in s
    )
    return int(line.split()[1]) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/huge_pages.json")
    args = ap.parse_args()
    before = huge_bytes()
    engines = {"huge pages": LLMEngine(EngineConfig(model=args.model, cpu_huge_pages=True))}
    huge_mb = (huge_bytes() - before) / 2**20
    engines["as loaded"] = LLMEngine(EngineConfig(model=args.model, cpu_huge_pages=False))
    runs: list[dict] = []
    for r in range(args.rounds):
        for streams in map(int, args.streams.split(",")):
            tokens = {}
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                ms, tokens[mode], prefill = decode(
                    engines[mode], f"r{r}-{streams}-{mode}", streams, args.tokens, r
                )
                runs.append(
                    {"round": r, "streams": streams, "mode": mode, "prefill_ms": prefill, "ms_per_token": ms}
                )
            runs[-1]["same_tokens"] = runs[-2]["same_tokens"] = tokens[MODES[0]] == tokens[MODES[1]]
    rows = []
    for streams in map(int, args.streams.split(",")):
        cell = {m: [x for x in runs if x["streams"] == streams and x["mode"] == m] for m in MODES}
        same = all(x["same_tokens"] for x in runs if x["streams"] == streams)
        for key, unit in (("ms_per_token", "decode ms/token"), ("prefill_ms", "prefill ms")):
            med = {m: statistics.median(x[key] for x in v) for m, v in cell.items()}
            rows.append([streams, unit, *(" / ".join(f"{x[key]:.1f}" for x in cell[m]) for m in MODES),
                         f"{med['as loaded'] / med['huge pages']:.2f}x", same])  # fmt: skip
    machine = f"{platform.processor() or platform.machine()}, {platform.system()}"
    print(
        f"\n{args.model} on {machine}; the first engine put {huge_mb:.0f} MB on 2 MB pages; rounds in order\n"
    )
    table(["streams", "measure", *MODES, "as loaded / huge pages (medians)", "same tokens"], rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "machine": machine, "huge_mb": huge_mb, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
