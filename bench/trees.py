"""The engine on two source trees side by side: a refactor must not change its speed.

    git worktree add /tmp/before <commit>
    python bench/trees.py --tree before=/tmp/before --rounds 6 --out bench/results/trees.json

Each tree in a fresh process per round (bench/blas.py's probe with the bundled BLAS: matmul GFLOP/s
and the engine's decode tok/s at 1 and 16 sequences on the bundled model), rounds alternating the
order; this tree is `after`. Both trees run in this virtualenv: PYTHONPATH puts each tree's packages
ahead of the editable install's.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import subprocess

from bench.blas import REPO, machine, print_table, run_probe, summarize


def commit_of(tree: Path) -> str:
    """The tree's commit, `+` when it has uncommitted changes: what the JSON records, not a path."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=tree, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], check=False, cwd=tree, capture_output=True, text=True
    )
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="another tree")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="bench/results/trees.json")
    args = ap.parse_args()
    trees = {"after": REPO} | {name: Path(path) for name, path in (t.split("=", 1) for t in args.tree)}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for round_index in range(args.rounds):
        order = list(trees) if round_index % 2 == 0 else list(trees)[::-1]
        for name in order:
            runs[name].append(run_probe("", args.threads, args.max_tokens, trees[name]))
            print(f"round {round_index + 1} {name}: {runs[name][-1]}", flush=True)
    rows = [summarize(name, results) for name, results in runs.items()]
    print_table(rows, args.threads, label="tree")
    result = {
        "machine": machine(),
        "threads": args.threads,
        "rounds": args.rounds,
        "trees": {name: commit_of(tree) for name, tree in trees.items()},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
