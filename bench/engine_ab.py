"""Two engines of one model that differ in one setting, alternating in one process (a slow moment of
the machine slows both): per stream count, ms per decode token of one stream, the prefill's ms, and
whether both produced the same tokens. Used by bench/huge_pages.py and bench/exact_pack.py."""

from __future__ import annotations

import argparse
import statistics

from engine.llm_engine import LLMEngine

from bench.greedy_screen import decode


def arguments(description: str, out: str) -> argparse.Namespace:
    """The two benchmarks' shared command line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=out)
    return ap.parse_args()


def alternate(engines: dict[str, LLMEngine], streams: list[int], tokens: int, rounds: int) -> list[dict]:
    """Each round runs every stream count on both engines, the order of the two alternating by round;
    each round's prompts are new to the prefix cache."""
    modes = list(engines)
    runs: list[dict] = []
    for r in range(rounds):
        for n in streams:
            out = {}
            for mode in modes if r % 2 == 0 else modes[::-1]:
                ms, out[mode], prefill = decode(engines[mode], f"r{r}-{n}-{mode}", n, tokens, r)
                runs.append(
                    {"round": r, "streams": n, "mode": mode, "prefill_ms": prefill, "ms_per_token": ms}
                )
            runs[-1]["same_tokens"] = runs[-2]["same_tokens"] = out[modes[0]] == out[modes[1]]
    return runs


def rows(runs: list[dict], modes: list[str], streams: list[int]) -> list[list]:
    """Table rows: per stream count and measure, each run of both modes in order, the ratio of the
    medians (the second mode over the first: above 1 when the first is faster), same tokens."""
    out = []
    for n in streams:
        cell = {m: [x for x in runs if x["streams"] == n and x["mode"] == m] for m in modes}
        same = all(x["same_tokens"] for x in runs if x["streams"] == n)
        for key, unit in (("ms_per_token", "decode ms/token"), ("prefill_ms", "prefill ms")):
            med = {m: statistics.median(x[key] for x in v) for m, v in cell.items()}
            runs_text = [" / ".join(f"{x[key]:.1f}" for x in cell[m]) for m in modes]
            out.append([n, unit, *runs_text, f"{med[modes[1]] / med[modes[0]]:.2f}x", same])
    return out
