"""Decode speed with every new feature off: this tree against an earlier commit, alternating in one run.

    python bench/default_ab.py --base c20ad3b [--streams 1,16] [--max-tokens 64] [--rounds 3]
                               [--out bench/results/default_ab.json]

A feature that is off by default must cost nothing. The base commit is checked out in a temporary git
worktree; each round runs one child process per tree (the base first in odd rounds, this tree first in
even ones), each building the engine with its defaults on the bundled model and timing greedy decode of
`--streams` ~200-token prompts (EOS ignored) after a warm-up. Prints a markdown table of the median
tok/s per tree and stream count, and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile

CHILD = """
import sys, time, json
sys.path.insert(0, sys.argv[1])
import engine  # loads OpenBLAS before MLX
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
streams, max_tokens = int(sys.argv[2]), int(sys.argv[3])
llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=512 << 20))
text = " ".join(f"item {i} of the list is a word about topic {i % 7}." for i in range(24))
def run(n, tokens):
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(n):
        ids = llm.tokenizer.encode(f"{i}: {text}")
        llm.add_request(GenerateRequest(f"r{time.monotonic_ns()}-{i}", ids, params))
    while llm.has_unfinished_requests():
        llm.step()
run(2, 8)
start = time.perf_counter()
run(streams, max_tokens)
print(json.dumps({"tokens_per_s": streams * max_tokens / (time.perf_counter() - start)}))
"""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/default_ab.json")
    return ap.parse_args()


def measure(tree: Path, streams: int, max_tokens: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(streams), str(max_tokens)],
        check=True, capture_output=True, text=True, cwd=tree, env=os.environ | {"PYTHONPATH": str(tree)},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
    args = parse_args()
    worktree = Path(tempfile.mkdtemp(prefix="default-ab-")) / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.base], check=True, cwd=REPO)
    trees = {"base": worktree, "this tree": REPO}
    results: dict[str, dict[int, list[float]]] = {name: {} for name in trees}
    try:
        for round_index in range(args.rounds):
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for streams in [int(s) for s in args.streams.split(",")]:
                for name in order:
                    rate = measure(trees[name], streams, args.max_tokens)
                    results[name].setdefault(streams, []).append(rate)
                    print(f"round {round_index + 1} {name} @ {streams}: {rate:.1f} tok/s", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], check=False, cwd=REPO)
    print("\n| streams | base tok/s (median) | this tree tok/s (median) | ratio |")
    print("|---|---|---|---|")
    for streams in results["base"]:
        base, new = (statistics.median(results[n][streams]) for n in trees)
        print(f"| {streams} | {base:.1f} | {new:.1f} | {new / base:.2f} |")
    meta = {"machine": platform.platform(), "args": vars(args)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
