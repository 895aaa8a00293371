"""KV-cache quantization (`kv_cache_dtype`) on the bundled model: what one KV byte budget holds, and decode speed.

    python bench/kv_quant.py [--budget-mib 256] [--seq-len 1024] [--rounds 1] [--out bench/results/kv_quant.json]

Rows: auto (the model's float32 K/V, with the CPU's default fast paths), auto with the C forward and the
in-place window attention turned off (the gather path), int8 and int4 (decode in the C forward, which reads
and writes quantized pools; prefill gathers), and int8 with the C forward off (MLX's gather path). Columns: KV bytes per token, blocks and tokens the budget holds, sequences of
`--seq-len` tokens that fit at once, and decode tok/s at 16 concurrent sequences of ~200-token prompts
(engine-level, no Ray; EOS ignored; median of `--rounds` after a warm-up round).
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

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.platform.blas import blas_state

from bench.engine import engine_decode, prompts

VARIANTS: dict[str, dict] = {
    "auto": {},
    "auto, gather path": {"cpu_decode": False, "kv_in_place": False},
    "int8": {"kv_cache_dtype": "int8"},
    "int8, gather path": {"kv_cache_dtype": "int8", "cpu_decode": False},
    "int4": {"kv_cache_dtype": "int4"},
}


def measure(name: str, overrides: dict, args: argparse.Namespace) -> dict:
    config = EngineConfig(
        kv_cache_memory_bytes=args.budget_mib << 20, max_num_seqs=16, max_num_batched_tokens=512, **overrides
    )
    llm = LLMEngine(config)
    compute = llm.compute
    batch = prompts(llm, 16, 195)
    runs = [engine_decode(llm, batch, args.max_tokens)["tok_s"] for _ in range(args.rounds + 1)][1:]
    blocks_per_seq = -(-args.seq_len // config.block_size)
    return {
        "variant": name,
        "kv_cache_dtype": compute.kv_cache_dtype,
        "decode_path": compute.decode,
        "attention_path": compute.attention,
        "kv_bytes_per_token": compute.kv_bytes_per_token,
        "num_blocks": llm.storage.num_blocks,
        "capacity_tokens": compute.kv_capacity_tokens,
        "seqs_that_fit": llm.storage.num_blocks // blocks_per_seq,
        "decode_tok_s": statistics.median(runs),
        "runs_tok_s": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-mib", type=int, default=256, help="kv_cache_memory_bytes, in MiB")
    ap.add_argument("--seq-len", type=int, default=1024, help="sequence length for the 'fit' column")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens decoded per sequence")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default="bench/results/kv_quant.json")
    args = ap.parse_args()
    print(
        f"| kv | decode / attention | KV bytes/token | blocks in {args.budget_mib} MiB | tokens | "
        f"{args.seq_len}-token seqs | decode tok/s, 16 seqs |\n|---|---|---|---|---|---|---|"
    )
    rows = []
    for name, overrides in VARIANTS.items():
        row = measure(name, overrides, args)
        rows.append(row)
        print(
            f"| {name} | {row['decode_path']} / {row['attention_path']} | {row['kv_bytes_per_token']:,} | "
            f"{row['num_blocks']:,} | {row['capacity_tokens']:,} | {row['seqs_that_fit']} | "
            f"{row['decode_tok_s']:.1f} |",
            flush=True,
        )
    machine = f"{platform.machine()} {os.cpu_count()} cores"
    result = {"machine": machine, "blas": blas_state().reason, "args": vars(args), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
