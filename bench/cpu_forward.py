"""The CPU's C forward alone, in-process: its own matmuls (each weight read once for every row) against
OpenBLAS's (sgemv/sgemm, or sgemm over dequantized tiles of 4-bit weights), at each row count, under each
OPENBLAS_THREAD_TIMEOUT (how long OpenBLAS's threads spin after a call before they sleep).

    python bench/cpu_forward.py [--models bundled:smollm2-135m-instruct,bundled:smollm2-135m-instruct-q4]
        [--timeouts 20,28] [--rows 1,4,8,16,32] [--reps 5] [--threads 2] [--out bench/results/cpu_forward.json]

Each (model, timeout) runs in a fresh process (OpenBLAS reads the variable when it loads), with
`--threads` BLAS threads, the served Scheduler's count. One forward = every layer for `rows` rows at
position 0 of scratch pools, the logits of one row: the matmuls are the work. The two modes alternate
(a busy moment slows both alike); each cell is the median of `--reps` forwards, in ms. 20 is the
engine's default timeout (engine/platform/blas.py), 28 OpenBLAS's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse
import json
import os
import statistics
import subprocess
import time

from bench import serve_report


def measure(model: str, rows_list: list[int], reps: int) -> dict:
    """In this process: {rows: {"own": ms, "blas": ms}} for `model`'s C forward."""
    import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.runner.cpu.cpu_decode import CpuDecode

    llm = LLMEngine(EngineConfig(model=model))
    decode = llm.runner.decode
    assert isinstance(decode, CpuDecode), "the C forward serves this model"
    cells = {}
    for rows in rows_list:
        forward = decode.scratch_forward(rows)
        times: dict[str, list[float]] = {"own": [], "blas": []}
        for _ in range(reps):
            for mode, direct in (("own", rows), ("blas", 0)):
                times[mode].append(forward(direct) * 1000)
        cells[rows] = {mode: statistics.median(ms) for mode, ms in times.items()}
    return {"measured_direct_rows": [decode.direct_min, decode.direct_rows], "ms": cells}


def run_child(model: str, timeout: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, OPENBLAS_THREAD_TIMEOUT=timeout, OPENBLAS_NUM_THREADS=str(args.threads))
    command = [sys.executable, __file__, "--child", "--models", model, "--rows", args.rows]
    command += ["--reps", str(args.reps)]
    out = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{model} at timeout {timeout} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: list[dict], rows_list: list[int]) -> str:
    head = "| model | OPENBLAS_THREAD_TIMEOUT | own matmuls picked at load (rows) | " + " | ".join(
        f"{r} rows: own / OpenBLAS" for r in rows_list
    )
    lines = [head + " |", "|---" * (3 + len(rows_list)) + "|"]
    for r in results:
        cells = [f"{r['ms'][str(n)]['own']:.1f} / {r['ms'][str(n)]['blas']:.1f}" for n in rows_list]
        name = r["model"].removeprefix("bundled:")
        lowest, most = r["measured_direct_rows"]
        lines.append(f"| {name} | {r['timeout']} | {lowest}-{most} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bundled:smollm2-135m-instruct,bundled:smollm2-135m-instruct-q4")
    ap.add_argument("--timeouts", default="20,28")
    ap.add_argument("--rows", default="1,4,8,16,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/cpu_forward.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    if args.child:
        result = measure(args.models, rows_list, args.reps)
        print(json.dumps({"measured_direct_rows": result["measured_direct_rows"], "ms": result["ms"]}))
        return
    results = []
    for model in args.models.split(","):
        for timeout in args.timeouts.split(","):
            result = run_child(model, timeout, args) | {"model": model, "timeout": timeout}
            print(f"[{time.strftime('%H:%M:%S')}] {model} timeout {timeout}: {result['ms']}", file=sys.stderr)
            results.append(result)
    print(table(results, rows_list))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": serve_report.machine(), "settings": vars(args), "results": results}
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
