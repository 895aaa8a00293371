"""What the prefix cache's SHA-256 block hashes cost: per block, and per engine step on the bundled model.

    python bench/prefix_hash.py --out bench/results/prefix_hash.json

Per block: `chain_hash` (SHA-256 over the parent's hash, 16 int64 token ids and no salt) against the
64-bit `hash()` of the same tuple that it replaced, best of 5 rounds of 20,000 blocks. Per step: 16
requests of ~200-token prompts (sharing a 32-token prefix, as chat prompts share a system prompt),
128 tokens each, through one engine, with every call of `chain_hash` timed; the table shows its share
of the engine's step time.
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
import time
import timeit

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.core import kv_cache_manager
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

from bench.engine import prompts

BLOCK = list(range(1000, 1016))


def per_block_us() -> dict[str, float]:
    parent = kv_cache_manager.chain_hash(None, BLOCK)
    old_parent = hash((None, tuple(BLOCK)))
    number = 20_000
    cases = {
        "python_hash": lambda: hash((old_parent, tuple(BLOCK))),
        "sha256": lambda: kv_cache_manager.chain_hash(parent, BLOCK),
    }
    return {
        name: min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6 for name, fn in cases.items()
    }


def in_engine() -> dict[str, float]:
    llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=256 << 20, max_num_seqs=16))
    original = kv_cache_manager.chain_hash
    spent = [0.0, 0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start
            spent[1] += 1

    shared = llm.tokenizer.encode("You are a helpful assistant who tells stories to whoever asks for one.")
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    kv_cache_manager.chain_hash = timed
    try:
        steps, start = 0, time.perf_counter()
        for i, ids in enumerate(prompts(llm, 16, 150)):
            llm.add_request(GenerateRequest(f"h{i}", shared + ids, params))
        while llm.has_unfinished_requests():
            llm.step()
            steps += 1
        elapsed = time.perf_counter() - start
    finally:
        kv_cache_manager.chain_hash = original
    return {
        "steps": steps,
        "hashes": spent[1],
        "hash_ms_per_step": spent[0] / steps * 1e3,
        "step_ms": elapsed / steps * 1e3,
        "share": spent[0] / elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/prefix_hash.json")
    args = ap.parse_args()
    block = per_block_us()
    steps = in_engine()
    print("| per 16-token block | µs |\n|---|---|")
    for name, us in block.items():
        print(f"| {name} | {us:.2f} |")
    print(
        f"\nengine, 16 requests x (~200 prompt + 128 out): {steps['steps']} steps, {steps['hashes']} hashes, "
        f"{steps['hash_ms_per_step']:.3f} ms of hashing per step of {steps['step_ms']:.1f} ms "
        f"({steps['share'] * 100:.3f}%)"
    )
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "per_block_us": block,
        "engine": steps,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
