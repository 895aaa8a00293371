"""The cost of constrained decoding: decode tokens/s of 16 concurrent requests, with and without a json_schema.

    python bench/structured.py [--concurrency 16] [--max-tokens 128] [--repeats 3] [--out bench/results/structured.json]

Drives LLMEngine directly (no Ray). Same prompts for every row. The constrained run goes first; the
free run then makes each request exactly as long as its constrained twin (max_tokens = that
length, ignore_eos), so both runs decode the same batch sizes step for step. Rows: free vs json_schema, greedy and at temperature 1 (seeded), and json_schema with
the masks filled inline instead of on the background thread. tok/s counts the tokens of decode-only
steps over those steps' wall time (as bench/engine.py); each figure is the best of --repeats runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import os
import platform
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams, StructuredOutputs
from engine.output.structured_output import StructuredOutputManager
from engine.platform.blas import blas_state

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "genre": {"enum": ["drama", "comedy", "horror"]},
        "cast": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "year", "genre", "cast"],
    "additionalProperties": False,
}
TOPICS = ["a film", "a book", "a song", "a play", "a painting", "a game", "a poem", "a show"]


def prompts(llm: LLMEngine, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = f"Describe {TOPICS[i % len(TOPICS)]} number {i} as JSON with title, year, genre and cast."
        ids = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def run(llm: LLMEngine, batch: list[list[int]], params: list[SamplingParams]) -> dict:
    ids = [f"s{time.monotonic_ns()}-{i}" for i in range(len(batch))]
    for request_id, prompt, p in zip(ids, batch, params):
        llm.add_request(GenerateRequest(request_id, prompt, p))
    decode_s, decode_tokens, total_tokens = 0.0, 0, 0
    lengths = dict.fromkeys(ids, 0)
    while llm.has_unfinished_requests():
        is_decode = not llm.scheduler.waiting and all(
            r.num_computed_tokens >= r.num_tokens - 1 for r in llm.scheduler.running
        )
        start = time.perf_counter()
        outputs = llm.step()
        num_tokens = sum(len(o.new_token_ids) for o in outputs)
        for o in outputs:
            lengths[o.request_id] += len(o.new_token_ids)
        total_tokens += num_tokens
        if is_decode and llm.scheduler.running:
            decode_s += time.perf_counter() - start
            decode_tokens += num_tokens
    return {"tok_s": decode_tokens / decode_s, "tokens": total_tokens, "lengths": list(lengths.values())}


def use_inline_masks(llm: LLMEngine, inline: bool) -> None:
    llm.structured = llm.outputs.structured = StructuredOutputManager(llm.tokenizer, overlap=not inline)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/structured.json")
    args = ap.parse_args()
    llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=1 << 30, max_num_seqs=64, max_num_batched_tokens=512))
    batch = prompts(llm, args.concurrency)
    spec = StructuredOutputs(json_schema=SCHEMA)
    rows = []
    print("| sampling | free tok/s | json_schema tok/s | slowdown | json_schema, inline masks tok/s |")
    print("|---|---|---|---|---|")
    for name, sampling in [
        ("greedy", {"temperature": 0.0}),
        ("temperature 1", {"temperature": 1.0, "seed": 1}),
    ]:
        constrained = [SamplingParams(max_tokens=args.max_tokens, structured=spec, **sampling)] * len(batch)
        lengths = run(llm, batch, constrained)["lengths"]  # also the warm-up: shapes, buffers, the compile
        free = [SamplingParams(max_tokens=n, ignore_eos=True, **sampling) for n in lengths]
        run(llm, batch, free)
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            for label, params, inline in [
                ("free", free, False),
                ("schema", constrained, False),
                ("inline", constrained, True),
            ]:
                use_inline_masks(llm, inline)
                result = run(llm, batch, params)
                result.pop("lengths")
                if label not in best or result["tok_s"] > best[label]["tok_s"]:
                    best[label] = result
        use_inline_masks(llm, False)
        row = {"sampling": name, **{f"{k}_tok_s": v["tok_s"] for k, v in best.items()}}
        row.update({f"{k}_tokens": v["tokens"] for k, v in best.items()})
        row["slowdown"] = 1 - row["schema_tok_s"] / row["free_tok_s"]
        rows.append(row)
        print(
            f"| {name} | {row['free_tok_s']:.0f} | {row['schema_tok_s']:.0f} | {row['slowdown']:.1%} | "
            f"{row['inline_tok_s']:.0f} |",
            flush=True,
        )
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "blas": blas_state().name,
        "load_avg": os.getloadavg(),
        "settings": vars(args),
        "schema": SCHEMA,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
