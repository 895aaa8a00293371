"""GPU benchmark of the engine against mlx-lm on random-weight Llama shapes (bench/gpu_models.py). No network.

    python bench/gpu.py [--shapes 1b,8b,8b-4bit] [--batches 1,8,32,64,128] [--max-tokens 128]
        [--warmup-tokens N] [--rounds 3] [--engine key=value ...] [--baseline key=value ...] [--check]
        [--out bench/results/gpu.json]

Rows, each naming the device (`mx.device_info()["device_name"]`, e.g. "NVIDIA H100 80GB HBM3"): the two
ceilings (bf16 matmul TFLOP/s, copy GB/s counting bytes read and written); per shape, decode tokens/s of
the engine and of mlx-lm's BatchGenerator at each batch size, each as a share of the memory-bandwidth
roofline (batch x copy bandwidth / bytes a step reads: every stored weight tensor once, as stored, so a
4-bit model counts its packed weights, scales and biases; an untied input embedding table is left out, as a
step reads only its batch's rows, and a tied one counted once since the output head reads all of it);
prefill tokens/s of one 2,048-token prompt as a share of the matmul roofline (2 FLOPs per token per
logical parameter outside the embedding table and output head); at batch 64, the engine's decode with all
rows greedy against one row in five sampled (temperature 0.8, top_p 0.95, seeded); and, with `--check`,
a greedy check that the GPU engine's tokens match the CPU engine's and mlx-lm's.

`--engine key=value` sets EngineConfig fields of the engine under test (values parsed as JSON where they
parse); `--baseline key=value` runs the engine again in the same process with those fields on top of
`--engine`'s (e.g. `--baseline cuda_graph=false`) and reports both. The engine, its baseline and mlx-lm
load one after another, each freed before the next, so an 80 GB card holds the 8B bf16 model once at a time.
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
import platform
import statistics
import tempfile
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX on CPU-only machines)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load as mlx_lm_load
from pydantic import ValidationError

from bench.gpu_check import PAIRS, greedy_check
from bench.gpu_models import BuiltModel, Shape, build_model_dir, parse_overrides, parse_shapes

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, ignore_eos=True)
SAMPLED_EVERY = 5  # the mixed row: one request in five sampled, the rest greedy
_T0 = time.perf_counter()


def log(msg: str) -> None:
    """A progress line: runs are remote and long, so each step says when it ended and what memory holds."""
    active = mx.get_active_memory() / 1e9
    print(
        f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - _T0:6.0f}s {active:5.1f} GB] {msg}", flush=True
    )


def free_memory() -> None:
    gc.collect()
    mx.clear_cache()


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    keys = mx.random.randint(2, vocab, (n, length), key=mx.random.key(seed))
    return keys.tolist()


# ---- ceilings -----------------------------------------------------------------------------------


def timed(fn, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        mx.eval(fn())
    t0 = time.perf_counter()
    for _ in range(iters):
        mx.eval(fn())
    return (time.perf_counter() - t0) / iters


def ceilings(n: int = 8192, copy_elems: int = 1 << 29) -> dict:
    a = mx.random.normal((n, n)).astype(mx.bfloat16)
    b = mx.random.normal((n, n)).astype(mx.bfloat16)
    matmul_s = timed(lambda: a @ b, 20)
    x = mx.random.normal((copy_elems,)).astype(mx.bfloat16)  # 1 GiB by default
    copy_s = timed(lambda: x + 1, 20)
    return {"matmul_tflops": 2 * n**3 / matmul_s / 1e12, "copy_gbs": 2 * x.nbytes / copy_s / 1e9}


# ---- the engine ---------------------------------------------------------------------------------


def median_of(rounds: int, measure, *args) -> float:
    """The median of `rounds` calls of `measure(*args)` (tokens/s): one run of a few dozen steps moves
    with the host's load."""
    return statistics.median(measure(*args) for _ in range(rounds))


def engine_config(model_dir: Path, overrides: dict, **fixed) -> EngineConfig:
    """The bench's defaults, then the command line's overrides, then what a measurement must fix."""
    defaults = {
        "model": str(model_dir),
        "max_num_batched_tokens": 2048,
        "kv_cache_memory_bytes": 8 << 30,
        "enable_prefix_caching": False,
    }
    return EngineConfig(**{**defaults, **overrides, **fixed})


def engine_decode(llm: LLMEngine, batch: list[list[int]], max_tokens: int, sampled_every: int = 0) -> float:
    """Tokens/s from the moment every request has its first token until all finish (decode only).
    With `sampled_every` n, rows 0, n, 2n, ... sample (seeded by row) and the rest are greedy."""
    tag = time.monotonic_ns()
    for i, ids in enumerate(batch):
        sampled = sampled_every and i % sampled_every == 0
        params = dataclasses.replace(SAMPLED, seed=i) if sampled else GREEDY
        llm.add_request(
            GenerateRequest(f"d{tag}-{i}", ids, dataclasses.replace(params, max_tokens=max_tokens))
        )
    started: set[str] = set()
    t0, num_tokens = None, 0
    while llm.has_unfinished_requests():
        for out in llm.step():
            if t0 is not None:
                num_tokens += len(out.new_token_ids)
            elif out.new_token_ids:
                started.add(out.request_id)
        if t0 is None and len(started) == len(batch):
            t0 = time.perf_counter()
    return num_tokens / (time.perf_counter() - t0)


def engine_prefill(llm: LLMEngine, ids: list[int]) -> float:
    params = dataclasses.replace(GREEDY, max_tokens=1)
    llm.add_request(GenerateRequest(f"p{time.monotonic_ns()}", ids, params))
    t0 = time.perf_counter()
    while llm.has_unfinished_requests():
        llm.step()
    return len(ids) / (time.perf_counter() - t0)


def measure_engine(label: str, config: EngineConfig, work: dict) -> dict:
    """Decode at each batch (the median of --rounds runs), prefill and the mixed-sampling pair (their runs
    alternating), each after a warm-up round."""
    llm = LLMEngine(config)
    paths = dataclasses.asdict(llm.compute) if hasattr(llm, "compute") else {}
    log(f"{label}: loaded, decode path {paths.get('decode', '?')}, sampling {paths.get('sampling', '?')}")
    decode = {}
    for b, batch in work["batches"].items():
        # By default the warm-up meets every (batch, context) bucket the measured run meets: a decode
        # graph compiled inside the measured run (its context crossing a power of two of blocks) is a
        # one-time cost, not the steady state. --warmup-tokens 8 is the earlier, shorter warm-up.
        engine_decode(llm, batch, work["warmup_tokens"])
        decode[b] = median_of(work["rounds"], engine_decode, llm, batch, work["max_tokens"])
        log(f"{label}: batch {b} decode {decode[b]:,.0f} tok/s")
    engine_prefill(llm, work["prefill_ids"])
    prefill = engine_prefill(llm, work["prefill_ids"])
    log(f"{label}: prefill {prefill:,.0f} tok/s")
    for every in (0, SAMPLED_EVERY):
        engine_decode(llm, work["mixed_batch"], work["warmup_tokens"], every)
    rounds: dict[str, list[float]] = {"greedy_tok_s": [], "mixed_tok_s": []}
    for _ in range(work["rounds"]):  # the two alternate: a slow moment of the host slows both alike
        for name, every in (("greedy_tok_s", 0), ("mixed_tok_s", SAMPLED_EVERY)):
            rounds[name].append(engine_decode(llm, work["mixed_batch"], work["max_tokens"], every))
    mixed = {name: statistics.median(values) for name, values in rounds.items()}
    mixed["ratio"] = mixed["mixed_tok_s"] / mixed["greedy_tok_s"]
    log(f"{label}: mixed sampling {mixed['mixed_tok_s']:,.0f} vs greedy {mixed['greedy_tok_s']:,.0f} tok/s")
    llm.close()
    return {"compute_paths": paths, "decode": decode, "prefill_tok_s": prefill, "mixed": mixed}


# ---- mlx-lm -------------------------------------------------------------------------------------


def batchgen_decode(model, batch: list[list[int]], max_tokens: int) -> float:
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=[], completion_batch_size=len(batch))
    gen.insert(batch, [max_tokens] * len(batch))
    started: set[int] = set()
    t0, num_tokens = None, 0
    while responses := gen.next_generated():
        for r in responses:
            if t0 is not None:
                num_tokens += 1
            else:
                started.add(r.uid)
        if t0 is None and len(started) == len(batch):
            t0 = time.perf_counter()
    gen.close()
    return num_tokens / (time.perf_counter() - t0)


def mlx_lm_prefill(model, ids: list[int]) -> float:
    cache = make_prompt_cache(model)
    tokens = mx.array([ids])
    t0 = time.perf_counter()
    mx.eval(model(tokens, cache=cache)[:, -1])
    return len(ids) / (time.perf_counter() - t0)


def measure_mlx_lm(model_dir: Path, work: dict) -> dict:
    model, _ = mlx_lm_load(str(model_dir))
    log("mlx-lm: loaded")
    decode = {}
    for b, batch in work["batches"].items():
        batchgen_decode(model, batch, work["warmup_tokens"])  # the same warm-up as the engine's
        decode[b] = median_of(work["rounds"], batchgen_decode, model, batch, work["max_tokens"])
        log(f"mlx-lm: batch {b} BatchGenerator {decode[b]:,.0f} tok/s")
    mlx_lm_prefill(model, work["prefill_ids"])
    prefill = mlx_lm_prefill(model, work["prefill_ids"])
    log(f"mlx-lm: prefill {prefill:,.0f} tok/s")
    return {"decode": decode, "prefill_tok_s": prefill}


# ---- greedy check -------------------------------------------------------------------------------


def run_check(model_dir: Path, vocab: int, overrides: dict) -> dict:
    batch = [prompts(1, length, vocab, seed=7 + length)[0] for length in (12, 21, 40)]
    gpu = "gpu" if mx.is_available(mx.gpu) else "cpu"  # "cpu" only in a --tiny smoke run
    ways = {
        "engine_gpu_bf16": (gpu, "bfloat16"),
        "engine_gpu_f32": (gpu, "float32"),
        "engine_cpu_f32": ("cpu", "float32"),
    }
    configs = {
        name: engine_config(model_dir, overrides, device=device, dtype=dtype, max_num_seqs=len(batch))
        for name, (device, dtype) in ways.items()
    }
    return greedy_check(model_dir, batch, configs, log)


# ---- the run ------------------------------------------------------------------------------------


def device_name() -> str:
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    return str(
        info.get("device_name") or info.get("architecture") or platform.processor() or platform.machine()
    )


def table(headers: list[str], rows: list[list]) -> None:
    print("\n| " + " | ".join(headers) + " |\n|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    sys.stdout.flush()


def summarize(device: str, name: str, result: dict, prompt_len: int) -> dict:
    """The rows the tables print, each naming the device: decode per batch (engine, baseline if any,
    BatchGenerator), prefill per runner, mixed sampling per engine."""
    runs, roof, p_roof = result["runs"], result["roofline_steps_s"], result["prefill_roofline_tok_s"]
    engines = [k for k in runs if k != "mlx_lm"]
    where = {"device": device, "shape": name}
    decode = []
    for b, batchgen_tok_s in runs["mlx_lm"]["decode"].items():
        row = {**where, "batch": b, **{f"{k}_tok_s": runs[k]["decode"][b] for k in engines}}
        decode.append(row | {"batchgen_tok_s": batchgen_tok_s, "roofline_tok_s": b * roof})
    prefill = [
        {
            **where,
            "prompt_len": prompt_len,
            "by": k,
            "tok_s": runs[k]["prefill_tok_s"],
            "roofline_tok_s": p_roof,
        }
        for k in runs
    ]
    mixed = [{**where, "engine": k, "batch": result["mixed_batch"], **runs[k]["mixed"]} for k in engines]
    return {"decode": decode, "prefill": prefill, "mixed": mixed}


def print_rows(rows: dict, engines: list[str]) -> None:
    who = [*engines, "batchgen"]
    names = [*engines, "BatchGenerator"]
    headers = [f"{k} tok/s" for k in names] + [f"{k}/BatchGenerator" for k in engines]
    table(
        ["device", "shape", "batch", *headers, *(f"{k} % roofline" for k in names)],
        [
            [r["device"], r["shape"], r["batch"], *(f"{r[f'{k}_tok_s']:,.0f}" for k in who)]
            + [f"{r[f'{k}_tok_s'] / r['batchgen_tok_s']:.2f}x" for k in engines]
            + [f"{100 * r[f'{k}_tok_s'] / r['roofline_tok_s']:.1f}%" for k in who]
            for r in rows["decode"]
        ],
    )
    table(
        ["device", "shape", "prompt tokens", "prefill by", "tok/s", "% matmul roofline"],
        [
            [r["device"], r["shape"], r["prompt_len"], r["by"], f"{r['tok_s']:,.0f}"]
            + [f"{100 * r['tok_s'] / r['roofline_tok_s']:.0f}%"]
            for r in rows["prefill"]
        ],
    )
    table(
        ["device", "shape", "engine", "batch", "all greedy tok/s", "1 in 5 sampled tok/s", "sampled/greedy"],
        [
            [r["device"], r["shape"], r["engine"], r["batch"], f"{r['greedy_tok_s']:,.0f}"]
            + [f"{r['mixed_tok_s']:,.0f}", f"{r['ratio']:.2f}"]
            for r in rows["mixed"]
        ],
    )


def print_check(device: str, name: str, check: dict) -> None:
    print(f"\n{device}, {name}: greedy check, 3 prompts x {check['tokens']} tokens:")
    for key in PAIRS:
        print(f"  {key}: {check[key]}")


def run_shape(shape: Shape, args, variants: dict[str, dict], ceil: dict) -> dict:
    vocab = shape.config["vocab_size"]
    batches = [int(x) for x in args.batches.split(",")]
    work = {
        "batches": {b: prompts(b, 32, vocab, seed=b) for b in batches},
        "mixed_batch": prompts(args.mixed_batch, 32, vocab, seed=args.mixed_batch),
        "prefill_ids": prompts(1, args.prompt_len, vocab, seed=1)[0],
        "max_tokens": args.max_tokens,
        "warmup_tokens": args.warmup_tokens or args.max_tokens,
        "rounds": args.rounds,
    }
    max_num_seqs = max(batches + [args.mixed_batch])
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        built: BuiltModel = build_model_dir(Path(tmp), shape)
        free_memory()
        roof = ceil["copy_gbs"] * 1e9 / built.step_bytes  # steps/s when each step reads every weight once
        result = {
            "config": shape.config,
            "model": {k: v for k, v in dataclasses.asdict(built).items() if k != "path"},
            "roofline_steps_s": roof,
            "prefill_roofline_tok_s": ceil["matmul_tflops"] * 1e12 / (2 * built.matmul_params),
            "mixed_batch": args.mixed_batch,
            "runs": {},
        }
        log(
            f"{shape.name}: built in {built.build_s:.0f} s, {built.num_params / 1e9:.3f} B parameters, "
            f"{built.weight_bytes / 1e9:.2f} GB stored, {built.step_bytes / 1e9:.2f} GB read per step, "
            f"roofline {roof:,.0f} steps/s"
        )
        for label, overrides in variants.items():
            config = engine_config(Path(tmp), overrides, max_num_seqs=max_num_seqs, **_tiny_kv(args))
            result["runs"][label] = measure_engine(f"{shape.name} {label}", config, work)
            free_memory()
        result["runs"]["mlx_lm"] = measure_mlx_lm(Path(tmp), work)
        free_memory()
        if args.check:
            result["greedy_check"] = run_check(Path(tmp), vocab, variants["engine"])
    return result


def _tiny_kv(args) -> dict:
    return {"kv_cache_memory_bytes": 256 << 20} if args.tiny else {}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu.json")
    parser.add_argument("--shapes", default="1b", help="comma-separated: 1b, 8b, 8b-4bit (1b-4bit too)")
    parser.add_argument("--batches", default="1,8,32,64,128")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="measured decode rounds per cell (median)")
    parser.add_argument(
        "--warmup-tokens", type=int, help="tokens of each decode warm-up round (default: --max-tokens)"
    )
    parser.add_argument(
        "--prompt-len", type=int, help="prefill prompt length (default 2048; 128 with --tiny)"
    )
    parser.add_argument(
        "--mixed-batch", type=int, help="batch of the mixed-sampling row (default 64; 10 with --tiny)"
    )
    parser.add_argument(
        "--engine", action="append", default=[], metavar="KEY=VALUE", help="EngineConfig field"
    )
    parser.add_argument(
        "--baseline", action="append", default=[], metavar="KEY=VALUE",
        help="run the engine a second time with these fields on top of --engine's",
    )  # fmt: skip
    parser.add_argument("--check", action="store_true", help="also run the greedy token check on each shape")
    parser.add_argument("--tiny", action="store_true", help="2-layer models: a quick smoke run on a CPU")
    parser.add_argument("--workdir", help="where the model directories are written (default: the temp dir)")
    args = parser.parse_args()
    # --tiny runs on a CPU in a few minutes: shorter prompts, a smaller mixed batch.
    args.prompt_len = args.prompt_len or (128 if args.tiny else 2048)
    args.mixed_batch = args.mixed_batch or (10 if args.tiny else 64)
    return args


def main() -> None:
    args = parse_args()
    shapes = parse_shapes(args.shapes, args.tiny)
    variants = {"engine": parse_overrides(args.engine, "--engine")}
    if args.baseline:
        variants["baseline"] = {**variants["engine"], **parse_overrides(args.baseline, "--baseline")}
    for overrides in variants.values():
        try:  # a misspelt field fails here, before any model is built
            engine_config(Path("."), overrides)
        except ValidationError as exc:
            raise SystemExit(f"--engine/--baseline: {exc}") from None
    device = device_name()
    results: dict = {"device": device, "machine": f"{device}, {platform.machine()}, MLX {mx.__version__}"}
    results.update(args=vars(args), variants=variants, shapes={})
    results["ceilings"] = ceil = ceilings(256, 1 << 22) if args.tiny else ceilings()
    log(
        f"{results['machine']}: matmul {ceil['matmul_tflops']:.3g} TFLOP/s, copy {ceil['copy_gbs']:,.0f} GB/s"
    )
    for shape in shapes:
        result = run_shape(shape, args, variants, ceil)
        result["rows"] = summarize(device, shape.name, result, args.prompt_len)
        results["shapes"][shape.name] = result
        print_rows(result["rows"], list(variants))
        if "greedy_check" in result:
            print_check(device, shape.name, result["greedy_check"])
        # After each shape, so a run cut off by its time limit keeps the shapes it finished.
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        free_memory()
    log(f"done, results in {args.out}")


if __name__ == "__main__":
    main()
