"""Engine benchmark on the bundled model: this engine against mlx-lm, all in one run.

    python bench/engine.py [--out bench/results/engine.json] [--max-tokens 64] [--rounds 3]
    python bench/engine.py --attention-ab --out bench/results/engine_attention.json
    python bench/engine.py --steady-state 12 --out bench/results/engine_steady.json
    OPENBLAS_NUM_THREADS=2 python bench/engine.py --prefill-ab --out bench/results/engine_prefill_pairs.json
    OPENBLAS_NUM_THREADS=2 python bench/engine.py --decode-ab --out bench/results/engine_cpu_decode.json

Rows: aggregate decode tokens/s at 1, 8, 32 sequences vs mlx-lm's BatchGenerator (same prompts,
same weights, EOS ignored); single-stream decode vs mlx_lm's generate_step; KV memory used by live
tokens vs allocated; sequences that fit a fixed KV budget vs mlx-lm's contiguous batch cache; TTFT
of a request sharing a 1,000-token prefix vs cold; matmul GFLOP/s and decode with reference BLAS
vs OpenBLAS (a subprocess each, since BLAS is chosen when the process loads MLX).
`--steady-state N`: N waves of 16 fresh requests through one engine until its prefix cache fills
the pool, with the share of batched decode steps whose attention reads K/V in place per wave.
`--prefill-ab`: the prefill of 16 ~200-token prompts that share a 32-token prefix (as chat prompts
share a template's system prompt): the chunks as rows of the C forward (engine/runner/cpu/cpu_decode.py),
paired on two MLX streams (engine/runner/cpu/paired_prefill.py), or one at a time through MLX.
`--decode-ab`: decode at 1, 4 and 16 sequences of ~200-token prompts, decode steps as one C forward
(engine/runner/cpu/cpu_decode.py) or as MLX operations, alternating on one engine.
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
from dataclasses import replace

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.platform.blas import blas_state, blas_thread_setter, default_blas_threads
from engine.runner.cpu import activation_hook
from engine.runner.cpu.paired_prefill import make_paired_prefill

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step

from bench.blas import run_probe

WARMUP_TOKENS = 8
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wise",
    "owls",
    "watch",
    "from",
    "old",
    "oak",
    "trees",
]


def prompts(llm: LLMEngine, n: int, base_len: int) -> list[list[int]]:
    out = []
    for i in range(n):
        words = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(base_len + 7 * (i % 5)))
        ids = llm.tokenizer.encode(f"Story {i}: {words}. Continue the story.")
        out.append(ids)
    return out


def engine_decode(llm: LLMEngine, batch: list[list[int]], max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(batch):
        llm.add_request(GenerateRequest(f"d{time.monotonic_ns()}-{i}", ids, params))
    decode_s, decode_tokens, ratios = 0.0, 0, []
    while llm.has_unfinished_requests():
        # Requests wait in the engine's inbox until its first step, so an empty running list is a prefill.
        running = llm.scheduler.running
        plan_is_decode = (
            bool(running)
            and not llm.scheduler.waiting
            and all(r.num_computed_tokens == r.num_tokens - 1 for r in running)
        )
        t0 = time.perf_counter()
        outputs = llm.step()
        if plan_is_decode and llm.scheduler.running:
            decode_s += time.perf_counter() - t0
            decode_tokens += sum(len(o.new_token_ids) for o in outputs)
            ratios.append(kv_usage(llm))
    return {"tok_s": decode_tokens / decode_s, "kv_used_over_allocated": sum(ratios) / max(1, len(ratios))}


def kv_usage(llm: LLMEngine) -> float:
    live = sum(r.num_computed_tokens for r in llm.scheduler.running)
    allocated = sum(len(r.block_ids) for r in llm.scheduler.running) * llm.kv.block_size
    return live / allocated if allocated else 0.0


def batchgen_decode(model, batch: list[list[int]], max_tokens: int) -> dict:
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=[], completion_batch_size=len(batch))
    with activation_hook.stock(model), gen.stats() as stats:  # mlx-lm as shipped, not our CPU SwiGLU
        gen.insert(batch, [max_tokens] * len(batch))
        while gen.next_generated():
            pass
    gen.close()
    # generation_tps: generated tokens over the wall time not spent on prompt processing.
    return {"tok_s": stats.generation_tps}


def single_stream(llm: LLMEngine, ids: list[int], max_tokens: int, rounds: int) -> dict:
    """The engine and mlx-lm's generate_step on one prompt, alternating `rounds` times; medians."""
    engine_decode(llm, [ids], WARMUP_TOKENS)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(engine_decode(llm, [ids], max_tokens)["tok_s"])
        theirs.append(_generate_step_tok_s(llm, ids, max_tokens))
    return {
        "engine_tok_s": statistics.median(ours),
        "mlx_lm_tok_s": statistics.median(theirs),
        "engine_runs_tok_s": ours,
        "mlx_lm_runs_tok_s": theirs,
    }


def _generate_step_tok_s(llm: LLMEngine, ids: list[int], max_tokens: int) -> float:
    t0, n = None, 0
    with activation_hook.stock(llm.runner.model):  # mlx-lm as shipped, not our CPU SwiGLU
        for _token, _ in generate_step(mx.array(ids), llm.runner.model, max_tokens=max_tokens):
            if t0 is None:
                t0 = time.perf_counter()
            else:
                n += 1
    return n / (time.perf_counter() - t0)


def prefix_ttft(llm: LLMEngine) -> dict:
    prefix = llm.tokenizer.encode(" ".join(WORDS[i % len(WORDS)] for i in range(1200)))[:1000]

    def ttft(suffix: str) -> float:
        ids = prefix + llm.tokenizer.encode(suffix)
        rid = f"t{time.monotonic_ns()}"
        t0 = time.perf_counter()
        llm.add_request(GenerateRequest(rid, ids, SamplingParams(max_tokens=1, temperature=0.0)))
        while llm.has_unfinished_requests():
            llm.step()
        return time.perf_counter() - t0

    cold = ttft(" First question: what comes next?")
    warm = ttft(" Second question: who wrote this?")
    return {"cold_s": cold, "warm_s": warm, "speedup": cold / warm}


def fit_in_budget(llm: LLMEngine, prompt_len: int, max_tokens: int, budget_bytes: int) -> dict:
    """Sequences of prompt_len + max_tokens tokens that a KV budget holds: paged vs contiguous."""
    per_token = llm.storage.bytes_per_block(llm.storage.shapes, 1, llm.storage.keys[0].dtype)
    seq_len = prompt_len + max_tokens
    paged = budget_bytes // (-(-seq_len // llm.kv.block_size) * llm.kv.block_size * per_token)
    # mlx-lm's BatchKVCache grows in steps of 256 tokens for the whole (left-padded) batch.
    contiguous = budget_bytes // (-(-seq_len // 256) * 256 * per_token)
    return {"budget_bytes": budget_bytes, "seq_len": seq_len, "paged": paged, "contiguous": contiguous}


def blas_compare(max_tokens: int) -> dict:
    """Reference BLAS against the bundled OpenBLAS, each in a process of its own (bench/blas.py)."""
    threads = int(os.environ.get("OPENBLAS_NUM_THREADS") or default_blas_threads())
    return {mode: run_probe(mode, threads, max_tokens) for mode in ("reference", "bundled")}


def attention_ab(llm: LLMEngine, max_tokens: int, rounds: int) -> list[dict]:
    """Decode at 32 sequences with attention reading K/V in place vs gathering it through the
    block tables, at a short and a long context, alternating the two."""
    with_windows = llm.runner.attention
    gathering = replace(with_windows, in_place=None)
    rows = []
    print("| context words | in place tok/s | gather tok/s | ratio |\n|---|---|---|---|")
    for words in (40, 250):
        batch = prompts(llm, 32, words)
        results: dict[str, list[float]] = {"in_place": [], "gather": []}
        for mode in ["in_place", "gather"] * (rounds + 1):
            llm.runner.attention = with_windows if mode == "in_place" else gathering
            results[mode].append(engine_decode(llm, batch, max_tokens)["tok_s"])
        llm.runner.attention = with_windows
        row = {w: statistics.median(v[1:]) for w, v in results.items()}  # the first of each warms up
        row |= {"prompt_words": words, "runs": results, "ratio": row["in_place"] / row["gather"]}
        rows.append(row)
        print(f"| {words} | {row['in_place']:.1f} | {row['gather']:.1f} | {row['ratio']:.2f} |")
    return rows


PREFILL_MODES = ("c_forward", "paired", "one_at_a_time")


def prefill_ab(llm: LLMEngine, rounds: int) -> dict:
    """Seconds to prefill 16 fresh prompts (one token out each), the modes in turn (the order rotates each
    round): the chunks as rows of the C forward, paired on two MLX streams, or one at a time through
    MLX. Each round's prompts are new past their shared prefix, so only that prefix is ever cached."""
    decode, original = llm.runner.decode, llm.runner.paired
    chunks_in_c = getattr(decode, "serves_chunks", False)
    setter = blas_thread_setter()
    paired = make_paired_prefill(llm.runner.model, setter) if setter is not None else None
    assert paired is not None, "paired prefill cannot run here (not the CPU backend, or no OpenBLAS)"
    modes = [m for m in PREFILL_MODES if m != "c_forward" or chunks_in_c]
    shared = llm.tokenizer.encode("You are a helpful assistant who tells stories to whoever asks for one.")
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    print("| round | " + " | ".join(f"{m} s" for m in modes) + " |\n" + "|---" * (len(modes) + 1) + "|")
    for r in range(rounds + 1):  # round 0 warms every mode up and is not counted
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            llm.runner.paired = paired if mode == "paired" else None
            if decode is not None:
                decode.serves_chunks = mode == "c_forward"  # type: ignore[attr-defined]
            batch = [
                shared + llm.tokenizer.encode(f" {mode} round {r}.") + ids for ids in prompts(llm, 16, 150)
            ]
            start = time.perf_counter()
            for i, ids in enumerate(batch):
                llm.add_request(GenerateRequest(f"p{time.monotonic_ns()}-{i}", ids, params))
            while llm.has_unfinished_requests():
                llm.step()
            if r:
                results[mode].append(time.perf_counter() - start)
        if r:
            print(f"| {r} | " + " | ".join(f"{results[m][-1]:.2f}" for m in modes) + " |", flush=True)
    llm.runner.paired = original
    if decode is not None:
        decode.serves_chunks = chunks_in_c  # type: ignore[attr-defined]
    medians = {mode: statistics.median(v) for mode, v in results.items()}
    tokens = sum(len(ids) for ids in batch)
    print("medians: " + ", ".join(f"{m} {v:.2f} s ({tokens / v:.0f} tok/s)" for m, v in medians.items()))
    return {"prompt_tokens": [len(ids) for ids in batch], "runs_s": results, "median_s": medians}


def decode_ab(llm: LLMEngine, max_tokens: int, rounds: int) -> list[dict]:
    """Decode tokens/s with the C forward and with MLX's operations, alternating on one engine; the
    prompts are cached after the first round, so every round times decode steps only."""
    kernel = llm.runner.decode
    assert llm.runner.choice.names["decode"] == "c_forward", llm.runner.choice.not_taken.get("c_forward")
    rows = []
    print("| sequences | C forward tok/s | MLX tok/s | ratio |\n|---|---|---|---|")
    for num_seqs in (1, 4, 16):
        batch = prompts(llm, num_seqs, 195)
        results: dict[str, list[float]] = {"c_forward": [], "mlx": []}
        for r in range(rounds + 1):  # round 0 warms both up and is not counted
            for mode in ("c_forward", "mlx") if r % 2 else ("mlx", "c_forward"):
                llm.runner.decode = kernel if mode == "c_forward" else None
                tok_s = engine_decode(llm, batch, max_tokens)["tok_s"]
                if r:
                    results[mode].append(tok_s)
        llm.runner.decode = kernel
        row = {mode: statistics.median(v) for mode, v in results.items()}
        row |= {"sequences": num_seqs, "runs_tok_s": results, "ratio": row["c_forward"] / row["mlx"]}
        rows.append(row)
        print(f"| {num_seqs} | {row['c_forward']:.1f} | {row['mlx']:.1f} | {row['ratio']:.2f} |", flush=True)
    return rows


def steady_state(llm: LLMEngine, waves: int) -> list[dict]:
    """Waves of 16 requests (~200-token prompts, 128 tokens, a new one as each ends) through one
    engine: once finished requests' cached prefixes fill the pool, new requests get blocks among
    them, and batched decode reads K/V in place only while each row's blocks stay in a few runs."""
    from engine.runner.cpu import window_attention

    plans: list[bool] = []
    plan_windows = window_attention.plan_windows

    def counted(*args, **kwargs):
        plan = plan_windows(*args, **kwargs)
        plans.append(plan is not None)
        return plan

    window_attention.plan_windows = counted
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    rows = []
    print("| wave | tok/s | decode steps reading in place | blocks cached |\n|---|---|---|---|")
    try:
        for wave in range(waves):
            plans.clear()
            batch = [llm.tokenizer.encode(f"wave {wave}: ") + ids for ids in prompts(llm, 16, 180)]
            start = time.perf_counter()
            for i, ids in enumerate(batch):
                llm.add_request(GenerateRequest(f"steady-{wave}-{i}", ids, params))
            num_tokens = 0
            while llm.has_unfinished_requests():
                num_tokens += sum(len(o.new_token_ids) for o in llm.step())
            row = {
                "wave": wave,
                "tok_s": num_tokens / (time.perf_counter() - start),
                "in_place_share": sum(plans) / len(plans) if plans else None,
                "blocks_cached": llm.pool.num_cached,
            }
            rows.append(row)
            print(
                f"| {wave} | {row['tok_s']:.1f} | {row['in_place_share']:.2f} | {row['blocks_cached']} |",
                flush=True,
            )
    finally:
        window_attention.plan_windows = plan_windows
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/engine.json")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per side; the median counts")
    ap.add_argument(
        "--attention-ab", action="store_true", help="only compare in-place and gathered attention"
    )
    ap.add_argument(
        "--prefill-ab", action="store_true", help="only compare C-forward, paired and one-at-a-time prefill"
    )
    ap.add_argument("--decode-ab", action="store_true", help="only compare C-forward and MLX decode steps")
    ap.add_argument(
        "--steady-state", type=int, default=0, metavar="WAVES", help="only the steady-state waves"
    )
    args = ap.parse_args()
    llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=1 << 30, max_num_seqs=64, max_num_batched_tokens=512))
    if args.steady_state or args.attention_ab:
        llm.runner.decode = None  # both study MLX's decode attention, which the C forward replaces
    if args.steady_state:
        rows = steady_state(llm, args.steady_state)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"machine": f"{platform.machine()} {os.cpu_count()} cores", "waves": rows}, indent=2)
        )
        return
    if args.prefill_ab:
        result = prefill_ab(llm, args.rounds)
        result |= {"machine": f"{platform.machine()} {os.cpu_count()} cores", "blas": blas_state().reason}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        return
    if args.decode_ab:
        rows = decode_ab(llm, args.max_tokens, args.rounds)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "blas": blas_state().reason}
        Path(args.out).write_text(json.dumps(result | {"rows": rows}, indent=2))
        return
    if args.attention_ab:
        rows = attention_ab(llm, args.max_tokens, args.rounds)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"machine": f"{platform.machine()} {os.cpu_count()} cores", "rows": rows}, indent=2)
        )
        return
    model = llm.runner.model
    results: dict = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "blas": blas_state().name,
        "rows": [],
    }
    print(
        "| sequences | engine tok/s | BatchGenerator tok/s | ratio | KV used/allocated |\n|---|---|---|---|---|"
    )
    for b in [int(x) for x in args.batches.split(",")]:
        batch = prompts(llm, b, 40)
        # Warm both sides at this batch size first: MLX's buffer cache and the first-use costs of
        # new shapes would otherwise count against whichever runs first.
        engine_decode(llm, batch, WARMUP_TOKENS)
        batchgen_decode(model, batch, WARMUP_TOKENS)
        # Alternate the two and keep each side's median: this VM's speed drifts by 10% over a minute.
        runs = [
            (engine_decode(llm, batch, args.max_tokens), batchgen_decode(model, batch, args.max_tokens))
            for _ in range(args.rounds)
        ]
        ours = statistics.median(r[0]["tok_s"] for r in runs)
        theirs = statistics.median(r[1]["tok_s"] for r in runs)
        row = {
            "batch": b,
            "engine_tok_s": ours,
            "batchgen_tok_s": theirs,
            "ratio": ours / theirs,
            "engine_runs_tok_s": [r[0]["tok_s"] for r in runs],
            "batchgen_runs_tok_s": [r[1]["tok_s"] for r in runs],
            "kv_used_over_allocated": runs[-1][0]["kv_used_over_allocated"],
        }
        results["rows"].append(row)
        print(
            f"| {b} | {row['engine_tok_s']:.1f} | {row['batchgen_tok_s']:.1f} | {row['ratio']:.2f} | {row['kv_used_over_allocated']:.3f} |"
        )
    single = single_stream(llm, prompts(llm, 1, 40)[0], args.max_tokens, args.rounds)
    single["ratio"] = single["engine_tok_s"] / single["mlx_lm_tok_s"]
    results["single_stream"] = single
    print(
        f"\nsingle stream: engine {single['engine_tok_s']:.1f} tok/s, mlx_lm generate {single['mlx_lm_tok_s']:.1f} tok/s, ratio {single['ratio']:.2f}"
    )
    steady = engine_decode(llm, prompts(llm, 16, 180), 128)
    results["kv_steady_state"] = {
        "sequences": 16,
        "prompt_words": 180,
        "max_tokens": 128,
        "used_over_allocated": steady["kv_used_over_allocated"],
    }
    print(
        f"KV used/allocated at steady state (16 seqs, ~200-token prompts, 128 out): {steady['kv_used_over_allocated']:.3f}"
    )
    fit = fit_in_budget(llm, 200, 128, 256 << 20)
    results["fit_in_budget"] = fit
    print(
        f"sequences of {fit['seq_len']} tokens in {fit['budget_bytes'] >> 20} MiB of KV: paged {fit['paged']}, contiguous (mlx-lm) {fit['contiguous']}"
    )
    ttft = prefix_ttft(llm)
    results["prefix_ttft"] = ttft
    print(
        f"TTFT with a 1,000-token prefix: cold {ttft['cold_s'] * 1000:.0f} ms, cached {ttft['warm_s'] * 1000:.0f} ms, {ttft['speedup']:.1f}x"
    )
    blas = blas_compare(args.max_tokens)
    results["blas"] = blas
    for mode, row in blas.items():
        print(
            f"{mode:>9} BLAS: matmul 1024^3 fp32 {row['matmul_gflops']:.1f} GFLOP/s, single-stream decode {row['decode_1_tok_s']:.1f} tok/s"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
