"""The C forward's weights on 2 MB pages against where MLX loaded them, two engines in one process.

    env -u OPENBLAS_CORETYPE python bench/huge_pages.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,4,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--out bench/results/huge_pages.json]

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

import os

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

from bench.engine_ab import arguments, compare

MODES = ("huge pages", "as loaded")


def huge_bytes() -> int:
    """This process's anonymous memory on 2 MB pages."""
    line = next(
        s for s in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines() if "AnonHuge" in s
    )
    return int(line.split()[1]) * 1024


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/huge_pages.json")
    before = huge_bytes()
    engines = {"huge pages": LLMEngine(EngineConfig(model=args.model, cpu_huge_pages=True))}
    huge_mb = (huge_bytes() - before) / 2**20
    engines["as loaded"] = LLMEngine(EngineConfig(model=args.model, cpu_huge_pages=False))
    note = f"the first engine put {huge_mb:.0f} MB on 2 MB pages; rounds in order"
    ratios = ("as loaded / huge pages (medians)", "huge pages / as loaded (medians)")
    compare(engines, args, note, ratios, {"huge_mb": huge_mb})


if __name__ == "__main__":
    main()
