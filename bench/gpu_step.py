"""Where a GPU decode step's time goes, per batch: the engine's whole step against its decode forward alone.

    python bench/gpu_step.py [--shape 1b] [--batches 8,64,128] [--steps 150] [--engine key=value ...]
        [--out bench/results/gpu_step.json]

For each batch, on one random-weight model (bench/gpu_models.py): the engine's `step()` with every row
greedy, then with one row in five sampled (temperature 0.8, top_p 0.95), p50 and p90 over `--steps`
steps after a warm-up; then the decode fast path's forward alone on fixed inputs: the host time that
builds its lazy graph, the time to evaluate it, and forwards pipelined back to back with `async_eval`
(what the GPU needs per step when the host never waits). The engine step minus the pipelined forward is
the host work around the forward (scheduling, sampling, stop checks, outputs) that the GPU waits for.
Prints a table and writes JSON. `--tiny` builds 2-layer models (a CPU smoke run; the CPU has no decode
fast path of this kind, so only the engine columns fill).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX on CPU-only machines)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest

import mlx.core as mx

from bench.gpu import GREEDY, SAMPLED, SAMPLED_EVERY, device_name, table
from bench.gpu_models import build_model_dir, parse_overrides, parse_shapes
from bench.part_timer import PartTimer

PROMPT_LEN = 32


def ms(values: list[float], q: float = 0.5) -> float:
    return sorted(values)[int(q * (len(values) - 1))] * 1e3


# The engine's stages of a decode step, by owner attribute (None: the engine) and method. "read" waits for
# the launched step's tokens: it holds the time the host waits for the GPU.
PARTS = {
    "schedule": ("scheduler", "schedule"),
    "build forward": ("runner", "execute"),
    "launch sampling": ("sampler", "launch"),
    "read tokens": ("sampler", "read"),
    "commit": (None, "_commit"),
}


@contextlib.contextmanager
def timed_parts(llm: LLMEngine) -> Iterator[dict[str, float]]:
    """Seconds spent in each of PARTS while the block runs."""
    timer = PartTimer(PARTS)
    for part, (attr, method) in PARTS.items():
        timer.wrap(llm if attr is None else getattr(llm, attr), method, part)
    try:
        yield timer.spent
    finally:
        timer.unwrap()


def engine_steps(
    llm: LLMEngine, batch: int, mixed: bool, steps: int, parts: dict[str, float] | None = None
) -> list[float]:
    """Seconds of each of `steps` engine steps with `batch` rows decoding (after 40 warm-up steps); with
    `parts`, the ms per step of each of PARTS go into it."""
    tag = f"{'m' if mixed else 'g'}{time.monotonic_ns()}-"
    for i in range(batch):
        sampled = mixed and i % SAMPLED_EVERY == 0
        params = dataclasses.replace(SAMPLED if sampled else GREEDY, seed=i, max_tokens=4_000)
        llm.add_request(
            GenerateRequest(f"{tag}{i}", [(7 * i + j) % 1000 + 2 for j in range(PROMPT_LEN)], params)
        )
    for _ in range(40):
        llm.step()
    times = []
    with timed_parts(llm) as spent:
        for _ in range(steps):
            start = time.perf_counter()
            llm.step()
            times.append(time.perf_counter() - start)
    if parts is not None:
        parts.update({part: seconds / steps * 1e3 for part, seconds in spent.items()})
    for i in range(batch):
        llm.abort_request(f"{tag}{i}")
    while llm.has_unfinished_requests():
        llm.step()
    return times


def forward_alone(llm: LLMEngine, batch: int, steps: int) -> dict | None:
    """The decode fast path on fixed inputs (rows at position 40, blocks 3b..3b+2): ms per step."""
    decode = llm.runner.decode
    if decode is None or not hasattr(decode, "storage"):
        return None
    storage = decode.storage
    tokens = mx.array([5] * batch, dtype=mx.int32)
    offsets, tables = [40] * batch, [[3 * b, 3 * b + 1, 3 * b + 2] for b in range(batch)]
    for _ in range(5):
        mx.eval(decode.step(tokens, offsets, tables), *storage.arrays())
    build, evaluate = [], []
    for _ in range(steps):
        start = time.perf_counter()
        logits = decode.step(tokens, offsets, tables)
        built = time.perf_counter()
        mx.eval(logits, *storage.arrays())
        build.append(built - start)
        evaluate.append(time.perf_counter() - built)
    start = time.perf_counter()
    for _ in range(steps):
        mx.async_eval(decode.step(tokens, offsets, tables), *storage.arrays())
    mx.eval(*storage.arrays())
    pipelined = (time.perf_counter() - start) / steps
    return {"build_ms": ms(build), "eval_ms": ms(evaluate), "pipelined_ms": pipelined * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1b", help="1b, 8b or 8b-4bit (bench/gpu_models.py)")
    parser.add_argument("--batches", default="8,64,128")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--tiny", action="store_true", help="2-layer models: a quick smoke run on a CPU")
    parser.add_argument("--out", default="bench/results/gpu_step.json")
    parser.add_argument("--model-dir", help="a model directory built for --shape already (bench/gpu_env.py)")
    parser.add_argument(
        "--engine", action="append", default=[], metavar="KEY=VALUE", help="EngineConfig fields"
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or tmp
        if not args.model_dir:
            build_model_dir(Path(tmp), parse_shapes(args.shape, args.tiny)[0])
        config = EngineConfig(
            model=model_dir, kv_cache_memory_bytes=(256 << 20) if args.tiny else (8 << 30),
            max_num_batched_tokens=2048, max_num_seqs=max(batches), enable_prefix_caching=False,
            **parse_overrides(args.engine, "--engine"),
        )  # fmt: skip
        llm = LLMEngine(config)
        for batch in batches:
            parts: dict[str, float] = {}
            greedy = engine_steps(llm, batch, False, args.steps, parts)
            mixed = engine_steps(llm, batch, True, args.steps)
            row = {
                "batch": batch,
                "greedy_p50_ms": ms(greedy), "greedy_p90_ms": ms(greedy, 0.9),
                "mixed_p50_ms": ms(mixed), "mixed_p90_ms": ms(mixed, 0.9), "greedy_parts_ms": parts,
                "greedy_mean_ms": sum(greedy) / len(greedy) * 1e3,
                "forward": forward_alone(llm, batch, args.steps),
            }  # fmt: skip
            rows.append(row)
            print(f"batch {batch}: {row}", flush=True)
        llm.close()
    device = device_name()
    table(
        ["device", "shape", "batch", "engine step p50 (p90), greedy", "1 in 5 sampled", "forward: host build",
         "eval", "pipelined", "engine step - pipelined"],
        [
            [device, args.shape, r["batch"], f"{r['greedy_p50_ms']:.2f} ({r['greedy_p90_ms']:.2f}) ms",
             f"{r['mixed_p50_ms']:.2f} ({r['mixed_p90_ms']:.2f}) ms"]
            + ([f"{f['build_ms']:.2f} ms", f"{f['eval_ms']:.2f} ms", f"{f['pipelined_ms']:.2f} ms",
                f"{r['greedy_p50_ms'] - f['pipelined_ms']:.2f} ms"] if (f := r["forward"]) else ["-"] * 4)
            for r in rows
        ],
    )  # fmt: skip
    print('\nThe greedy step\'s stages, mean ms per step (the host waits for the GPU in "read tokens"):')
    table(
        ["device", "shape", "batch", "step (mean)", *PARTS, "rest"],
        [
            [device, args.shape, r["batch"], f"{r['greedy_mean_ms']:.2f}"]
            + [f"{r['greedy_parts_ms'][p]:.2f}" for p in PARTS]
            + [f"{r['greedy_mean_ms'] - sum(r['greedy_parts_ms'].values()):.2f}"]
            for r in rows
        ],
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
