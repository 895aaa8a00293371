"""One step's sampling of a (B, vocab) logits batch: the host sampler against the device sampler.

    python bench/sampling.py [--vocab 128256] [--batches 1,8,64] [--reps 20] [--out bench/results/sampling.json]

Runs on MLX's default device (a GPU where there is one). Mixes: all rows greedy; one row in five sampled
(temperature 0.8, top_p 0.95), the others greedy; every row sampled so. Each repetition makes fresh
logits and evaluates them first, so neither path finds them already copied; then it times what the
engine waits for: `Sampler.sample` (reads the logits to the host, samples in NumPy), or
`sample_on_device(...).read()` (builds the graph, evaluates it, reads the (B,) token ids), and on MLX's
CUDA backend the same with the draw kernel (engine/output/draw_kernel.py), which the engine uses there
for mixed batches. Median of `--reps` after two warm-up runs. On CUDA it first compares the kernel's
tokens with its NumPy mirror's on random rows (vocabularies of 5,000 to 128,256) and reports how many
differ.
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
import time
from collections.abc import Callable

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.messages import SamplingParams
from engine.output.device_sampler import sample_on_device
from engine.output.draw_kernel import Draw, for_device, mirror, row_params
from engine.output.sampler import Sampler, SamplingRow

import mlx.core as mx
import numpy as np

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)
MIXES: dict[str, Callable[[int], SamplingParams]] = {
    "all greedy": lambda i: GREEDY,
    "1 in 5 sampled": lambda i: SAMPLED if i % 5 == 0 else GREEDY,
    "all sampled": lambda i: SAMPLED,
}


def time_step(sample: Callable[[mx.array], object], batch: int, vocab: int, reps: int) -> float:
    """Median ms of `sample` over fresh, evaluated logits."""
    times = []
    for rep in range(reps + 2):
        logits = mx.random.normal((batch, vocab)) * 3.0
        mx.eval(logits)
        mx.synchronize()
        start = time.perf_counter()
        sample(logits)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def measure(batch: int, mix: str, vocab: int, reps: int, kernel: Draw | None) -> dict:
    rows = [SamplingRow(MIXES[mix](i), [1, 2, 3], []) for i in range(batch)]
    host = Sampler(0)
    paths = {
        "host": lambda logits: host.sample(logits, rows),
        "device": lambda logits: sample_on_device(logits, rows, host.uniforms(rows)).read(),
    }
    if kernel is not None:
        paths["kernel"] = lambda logits: sample_on_device(logits, rows, host.uniforms(rows), kernel).read()
    out: dict = {"batch": batch, "mix": mix}
    for name, sample in paths.items():
        out[f"{name}_ms"] = time_step(sample, batch, vocab, reps)
    return out


def kernel_against_mirror(kernel: Draw, trials: int = 20, batch: int = 32) -> tuple[int, int]:
    """(rows whose token differs, rows) between the kernel and its NumPy mirror on random batches."""
    rng = np.random.default_rng(5)
    parted = 0
    for _ in range(trials):
        vocab = int(rng.choice([5000, 32000, 128256]))
        rows = [
            SamplingRow(SamplingParams(
                temperature=float(rng.choice([0.0, 0.1, 0.7, 1.0, 2.0])),
                top_p=float(rng.choice([1.0, 0.9, 0.5, 0.99])), min_p=float(rng.choice([0.0, 0.05])),
            ), [1], [])
            for _ in range(batch)
        ]  # fmt: skip
        logits = (rng.standard_normal((batch, vocab)) * rng.choice([0.5, 3.0, 10.0], (batch, 1))).astype(
            np.float32
        )
        params = row_params(rows, rng.random(batch).astype(np.float32))
        parted += int((np.asarray(kernel(mx.array(logits), params)) != mirror(logits, params)).sum())
    return parted, trials * batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/results/sampling.json")
    args = ap.parse_args()
    device = str(mx.default_device())
    kernel = for_device()
    parted = kernel_against_mirror(kernel) if kernel is not None else None
    print(f"device {device}, vocab {args.vocab}, draw kernel: {'in use' if kernel else 'not on this device'}")
    if parted is not None:
        print(f"kernel against its NumPy mirror: {parted[0]} of {parted[1]} rows chose another token")
    print("\n| B | mix | host ms | device ms | device with the kernel ms |\n|---|---|---|---|---|")
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for mix in MIXES:
            row = measure(batch, mix, args.vocab, args.reps, kernel)
            rows.append(row)
            with_kernel = f"{row['kernel_ms']:.2f}" if "kernel_ms" in row else "-"
            print(
                f"| {batch} | {mix} | {row['host_ms']:.2f} | {row['device_ms']:.2f} | {with_kernel} |",
                flush=True,
            )
    machine = f"{platform.machine()} {os.cpu_count()} cores"
    result = {"machine": machine, "device": device, "mlx": mx.__version__, "args": vars(args), "rows": rows,
              "kernel_against_mirror": parted}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
