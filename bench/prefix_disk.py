"""Time to first token of a long prefix after a restart: the prefix cache's disk tier against cold prefill.

    python bench/prefix_disk.py [--prefix-tokens 4000] [--suffix-tokens 24] [--repetitions 3]
                                [--out bench/results/prefix_disk.json]

Engine level, no Ray, the bundled model. Each repetition, in a fresh directory:
  A  an engine with `prefix_cache_disk` serves prefix + suffix 1 (its blocks go to disk), then closes;
  B  a new engine on the same directory serves prefix + suffix 2: the prefix comes from disk;
  C  an engine with no disk tier serves prefix + suffix 2: the whole prompt is prefilled.
Every engine first serves a short unrelated prompt, so one-time costs (the C decode build, first
allocations) stay out of the timings. TTFT is add_request -> the step that returns the first token
(max_tokens 1). B reads files that A just wrote, so they come from the OS page cache: this is a
process restart, not a cold disk. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import platform
import random
import statistics
import tempfile
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig, PrefixCacheDiskConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

from bench.serve import git_state

# The same words as the run in docs/benchmarks.md: another list gives other prompts.
WORDS = [
    "the",
    "a",
    "build",
    "log",
    "test",
    "cache",
    "block",
    "token",
    "prefix",
    "model",
    "agent",
    "tool",
    "file",
    "line",
    "error",
    "pass",
    "fail",
]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix-tokens", type=int, default=4000)
    ap.add_argument("--suffix-tokens", type=int, default=24)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=512 << 20)
    ap.add_argument("--out", default="bench/results/prefix_disk.json")
    return ap.parse_args()


def make_engine(args: argparse.Namespace, disk_path: str | None) -> LLMEngine:
    disk = PrefixCacheDiskConfig(path=disk_path, max_gb=4.0) if disk_path is not None else None
    return LLMEngine(EngineConfig(kv_cache_memory_bytes=args.kv_cache_memory_bytes, prefix_cache_disk=disk))


def random_tokens(llm: LLMEngine, num_tokens: int, seed: str) -> list[int]:
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(num_tokens * 2))
    token_ids = list(llm.tokenizer.encode(text))
    assert len(token_ids) >= num_tokens
    return token_ids[:num_tokens]


def ttft_s(llm: LLMEngine, request_id: str, prompt: list[int]) -> float:
    start_s = time.perf_counter()
    llm.add_request(GenerateRequest(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0)))
    first_s = None
    while llm.has_unfinished_requests():
        outputs = llm.step()
        if first_s is None and any(o.new_token_ids for o in outputs):
            first_s = time.perf_counter() - start_s
    assert first_s is not None
    return first_s


def warm_up(llm: LLMEngine, rep: int) -> None:
    ttft_s(llm, "warm-up", random_tokens(llm, 64, f"warm-{rep}"))


def one_repetition(args: argparse.Namespace, rep: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="prefix_disk_bench_") as path:
        writer = make_engine(args, path)
        prefix = random_tokens(writer, args.prefix_tokens, f"prefix-{rep}")
        first = prefix + random_tokens(writer, args.suffix_tokens, f"suffix-a-{rep}")
        second = prefix + random_tokens(writer, args.suffix_tokens, f"suffix-b-{rep}")
        warm_up(writer, rep)
        write_s = ttft_s(writer, "a", first)
        close_start_s = time.perf_counter()
        writer.close()
        flush_s = time.perf_counter() - close_start_s
        written = writer.stats().prefix_cache_disk_writes
        disk_bytes = writer.kv.disk.num_bytes if writer.kv.disk is not None else 0
        del writer

        reader = make_engine(args, path)
        warm_up(reader, rep)
        hits_before = reader.stats().prefix_cache_disk_hits
        disk_ttft_s = ttft_s(reader, "b", second)
        disk_hits = reader.stats().prefix_cache_disk_hits - hits_before
        reader.close()
        del reader

    cold = make_engine(args, None)
    warm_up(cold, rep)
    cold_ttft_s = ttft_s(cold, "c", second)
    del cold
    return {
        "repetition": rep,
        "prompt_tokens": len(second),
        "cold_ttft_s": cold_ttft_s,
        "disk_ttft_s": disk_ttft_s,
        "write_through_ttft_s": write_s,
        "close_flush_s": flush_s,
        "disk_hit_tokens": disk_hits,
        "blocks_written": written,
        "disk_bytes": disk_bytes,
    }


def main() -> None:
    args = parse_args()
    rows = []
    for rep in range(args.repetitions):
        rows.append(one_repetition(args, rep))
        print(f"repetition {rep}: {rows[-1]}", file=sys.stderr)
    cold = statistics.median(r["cold_ttft_s"] for r in rows)
    disk = statistics.median(r["disk_ttft_s"] for r in rows)
    write = statistics.median(r["write_through_ttft_s"] for r in rows)
    print(
        f"\nPrefix {args.prefix_tokens} tokens + suffix {args.suffix_tokens}, {args.repetitions} repetitions\n"
    )
    print("| run | TTFT median (s) | TTFT each (s) |")
    print("|---|---|---|")
    print(f"| C: cold prefill, no disk tier | {cold:.2f} | {_each(rows, 'cold_ttft_s')} |")
    print(f"| B: after restart, prefix from the disk tier | {disk:.2f} | {_each(rows, 'disk_ttft_s')} |")
    print(
        f"| A: cold prefill, writing through to disk | {write:.2f} | {_each(rows, 'write_through_ttft_s')} |"
    )
    print(
        f"\nspeedup C/B {cold / disk:.1f}x; disk hits {rows[0]['disk_hit_tokens']} tokens; "
        f"{rows[0]['blocks_written']} blocks, {rows[0]['disk_bytes'] / 1e6:.0f} MB on disk; "
        f"close() flush {statistics.median(r['close_flush_s'] for r in rows):.2f} s"
    )
    result = {
        "args": vars(args),
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "git": git_state(),
        "rows": rows,
        "median": {"cold_ttft_s": cold, "disk_ttft_s": disk, "write_through_ttft_s": write},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def _each(rows: list[dict], key: str) -> str:
    return ", ".join(f"{r[key]:.2f}" for r in rows)


if __name__ == "__main__":
    main()
