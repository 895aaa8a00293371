"""MLX's CUDA settings against each other on the GPU decode step: one model, one process per setting.

    python bench/gpu_env.py [--shape 1b] [--batches 8,64] [--steps 100] [--out bench/results/gpu_env.json]
        [--variant NAME=KEY=VALUE,KEY=VALUE ...]

MLX reads its CUDA environment variables once per process (how many operations go into one command
buffer, whether a buffer is captured as a CUDA graph), so each setting runs `bench/gpu_step.py` in a
process of its own, on one model directory built once. The default variants: MLX's defaults (with the
engine's own, engine/platform/cuda_env.py), larger command buffers, and CUDA graphs off. Prints the engine
step (greedy and one in five sampled) and the decode forward alone (evaluated, and pipelined) per setting
and batch, and writes JSON. `--tiny` is a CPU smoke run (2-layer models; the forward columns stay empty).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import os
import subprocess
import tempfile

from bench.gpu import device_name, table
from bench.gpu_models import build_model_dir, parse_shapes

VARIANTS = {
    "defaults": {},
    "ops/buffer 60": {"MLX_MAX_OPS_PER_BUFFER": "60"},
    "ops/buffer 200": {"MLX_MAX_OPS_PER_BUFFER": "200"},
    "graphs off": {"MLX_USE_CUDA_GRAPHS": "0"},
    "graphs off, ops/buffer 200": {"MLX_USE_CUDA_GRAPHS": "0", "MLX_MAX_OPS_PER_BUFFER": "200"},
}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """ "NAME=KEY=VALUE,KEY=VALUE" -> (NAME, {KEY: VALUE}); "NAME=" is MLX's defaults."""
    name, _, settings = text.partition("=")
    pairs = [item.split("=", 1) for item in settings.split(",") if item]
    if not name or any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...]")
    return name, dict(pairs)


def run_variant(args: argparse.Namespace, model_dir: str, env: dict[str, str], out: Path) -> dict:
    command = [sys.executable, str(Path(__file__).with_name("gpu_step.py")), "--shape", args.shape,
               "--batches", args.batches, "--steps", str(args.steps), "--model-dir", model_dir, "--out", str(out)]  # fmt: skip
    if args.tiny:
        command.append("--tiny")
    subprocess.run(command, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1b", help="1b, 8b or 8b-4bit (bench/gpu_models.py)")
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--variant", action="append", default=[], help="NAME=KEY=VALUE,... (replaces the defaults)"
    )
    parser.add_argument("--tiny", action="store_true", help="2-layer models: a quick smoke run on a CPU")
    parser.add_argument("--out", default="bench/results/gpu_env.json")
    args = parser.parse_args()
    variants = dict(parse_variant(v) for v in args.variant) if args.variant else VARIANTS
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        build_model_dir(model_dir, parse_shapes(args.shape, args.tiny)[0])
        for name, env in variants.items():
            report = run_variant(args, str(model_dir), env, Path(tmp) / "step.json")
            results.append({"variant": name, "env": env, "rows": report["rows"]})
            print(f"{name}: done", flush=True)
    device = device_name()
    table(
        ["device", "shape", "setting", "batch", "engine step p50, greedy", "1 in 5 sampled", "forward eval",
         "forward pipelined"],
        [
            [device, args.shape, r["variant"], row["batch"], f"{row['greedy_p50_ms']:.2f} ms",
             f"{row['mixed_p50_ms']:.2f} ms"]
            + ([f"{f['eval_ms']:.2f} ms", f"{f['pipelined_ms']:.2f} ms"] if (f := row["forward"]) else ["-", "-"])
            for r in results
            for row in r["rows"]
        ],
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"device": device, "args": vars(args), "variants": results}, indent=2)
    )


if __name__ == "__main__":
    main()
