"""The C forward's attention (engine/runner/cpu/cpu_attention.h): its 16-position vector loop against the
scalar loop every build has, in one process.

    env -u OPENBLAS_CORETYPE python bench/attention.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,16] [--tokens 96] [--rounds 3] [--closed-loop 16] [--reps 7]
        [--out bench/results/attention.json]

First whole forwards on scratch pools of random K/V, the two loops alternating (the fastest of `--reps`
each, ms): 16 decode rows of 16 sequences at positions 0, 264 (the 16-client load's mean: 200-token
prompts, 128 tokens out) and 1000, their K/V read from memory; 16 rows of one sequence at positions
1000-1015, their K/V read from cache; a 200-token prompt as one chunk, and a 256-token chunk of a
long prompt at 4000; and how far the two loops' logits are apart. Then the engine of the README's
defaults (its prefix cache off) in both modes alternating (bench/engine_ab.py's comparison of two
engines, here one calling for one loop or the other before every use: `attention_mode`). Prints
tables and writes JSON.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.cpu.cpu_decode import CpuDecode, _view

import numpy as np

from bench.engine_ab import arguments, compare
from bench.gpu import table

MODES = ("vector", "scalar")
# (name, rows, position, layout): "own" gives each row a sequence of its own at `position`, "chunk" the
# rows as one sequence's consecutive positions from `position` on (all reading the same blocks).
CASES = (
    ("16 rows at 0", 16, 0, "own"),
    ("16 rows at 264", 16, 264, "own"),
    ("16 rows at 1000", 16, 1000, "own"),
    ("16 rows at 1000-1015, one sequence (cached)", 16, 1000, "chunk"),
    ("200-token chunk", 200, 0, "chunk"),
    ("256-token chunk at 4000 (a long prompt's)", 256, 4000, "chunk"),
)


class Moded:
    """An engine that calls for one attention loop before every use."""

    def __init__(self, llm: LLMEngine, vector: bool):
        self._llm, self._vector = llm, vector

    def __getattr__(self, name: str):
        decode = self._llm.runner.decode
        assert isinstance(decode, CpuDecode)
        decode._lib.attention_mode(int(self._vector))
        return getattr(self._llm, name)


Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], int, np.ndarray]


def inputs(decode: CpuDecode, rows: int, position: int, layout: str) -> Inputs:
    """A forward's arguments over scratch pools of random K/V (logits of every row)."""
    views = [_view(a) for a in decode.pool_arrays(decode._storage)]
    block = views[0].shape[2]
    span = -(-(position + (rows if layout == "chunk" else 1)) // block)  # blocks a sequence needs
    sequences = rows if layout == "own" else 1
    tables = np.arange(sequences * span, dtype=np.int32).reshape(sequences, span)
    tables = tables if layout == "own" else np.tile(tables, (rows, 1))
    positions = position + (
        np.arange(rows, dtype=np.int32) if layout == "chunk" else np.zeros(rows, np.int32)
    )
    rng = np.random.default_rng(0)
    pools = [rng.standard_normal((v.shape[0], sequences * span, *v.shape[2:]), np.float32) for v in views]
    tokens = (np.arange(rows, dtype=np.int32) * 7919) % decode.vocab
    return tokens, positions, tables, pools, sequences * span, np.arange(rows, dtype=np.int32)


def forwards(decode: CpuDecode, reps: int) -> list[list]:
    """Per case: the fastest forward of each loop (alternating), their ratio, the largest difference of
    their logits (relative to the row's largest logit) and whether every row's argmax is the same."""
    out = []
    for name, rows, position, layout in CASES:
        tokens, positions, tables, kept, blocks, logit_rows = inputs(decode, rows, position, layout)
        best, logits = {m: float("inf") for m in MODES}, {}
        for _ in range(reps):
            for mode in MODES:
                decode._lib.attention_mode(int(mode == "vector"))
                pools = [p.copy() for p in kept]  # each call writes its rows' K/V
                began = time.perf_counter()
                logits[mode] = decode(tokens, positions, tables, pools, blocks, logit_rows)
                best[mode] = min(best[mode], time.perf_counter() - began)
        first, second = logits["scalar"], logits["vector"]
        differ = float((np.abs(first - second).max(axis=1) / np.abs(first).max(axis=1)).max())
        same = bool((first.argmax(axis=1) == second.argmax(axis=1)).all())
        ms = [best[m] * 1e3 for m in MODES]
        out.append([name, f"{ms[0]:.1f}", f"{ms[1]:.1f}", f"{ms[1] / ms[0]:.2f}x", f"{differ:.1e}", same])
    decode._lib.attention_mode(1)
    return out


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "bench/results/attention.json", {"--reps": "7"})
    # One engine serves both loops (a second engine of the same model came out up to 1.2x apart in
    # one-stream decode, where attention is a sliver); without its prefix cache, since both loops
    # are given the same prompts.
    llm = LLMEngine(EngineConfig(model=args.model, enable_prefix_caching=False))
    decode = llm.runner.decode
    assert isinstance(decode, CpuDecode), "the C forward serves this model"
    assert decode._lib.attention_mode(1) == 1, "this build has the vector loop (AVX-512)"
    print("\nWhole forwards, ms (the fastest of each, alternating)\n")
    cases = forwards(decode, int(args.reps))
    table(["forward", *MODES, "scalar / vector", "largest logit difference", "same argmax"], cases)
    engines = {"vector": Moded(llm, True), "scalar": Moded(llm, False)}
    compare(
        engines,  # type: ignore[arg-type]  # Moded passes every use through
        args,
        "rounds in order",
        ("scalar / vector (medians)", "vector / scalar (medians)"),
        {"forwards": cases},
    )


if __name__ == "__main__":
    main()
