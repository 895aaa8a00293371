"""Speculative decoding against plain decoding on an edit-this-code workload, engine level, no Ray.

    python bench/spec_decode.py [--streams 1,16] [--max-tokens 160] [--k 4] [--draft-layers 24]
                                [--out bench/results/spec_decode.json]

Each prompt is a chat request holding a short Python file and an instruction to rewrite it with one small
change, so most of the answer is in the prompt: the workload prompt lookup (n-gram drafts) is for. For
each stream count, in one process and in this order: plain decoding, n-gram drafts (k tokens), and a
draft model made from the bundled one (its first `--draft-layers` layers, bench/draft_models.py), which
exercises the draft-model path: it is no faster on a CPU, where a layer-prefix draft costs a large share
of the model. Every engine first serves a warm-up request. Greedy; tok/s is output tokens over the wall
time from the first add_request to the last token; the outputs of every speculative run are compared
with plain decoding's, token for token. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import platform
import tempfile
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig, SpeculativeConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

from bench.draft_models import bundled_draft
from bench.serve import git_state

SNIPPETS = [
    (
        'def load_config(path):\n    with open(path) as f:\n        data = json.load(f)\n    if "name" not in data:\n'
        '        raise ValueError("config needs a name")\n    return data\n\n\ndef save_config(path, data):\n'
        '    with open(path, "w") as f:\n        json.dump(data, f, indent=2)\n'
    ),
    (
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
        "    def is_empty(self):\n        return len(self.items) == 0\n"
    ),
    (
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n"
    ),
    (
        "def merge(base, override):\n    result = dict(base)\n    for key, value in override.items():\n"
        "        if isinstance(value, dict) and key in result:\n            result[key] = merge(result[key], value)\n"
        "        else:\n            result[key] = value\n    return result\n"
    ),
]
EDITS = ["rename the first function to have a prefix `my_`", "add type hints to every function"]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--draft-layers", type=int, default=24)
    ap.add_argument(
        "--engines",
        default="plain,ngram,ngram-limited,draft",
        help="which of plain, ngram, ngram-limited, draft",
    )
    ap.add_argument("--limit", type=int, default=8, help="ngram-limited: disable_by_batch_size")
    ap.add_argument("--out", default="bench/results/spec_decode.json")
    return ap.parse_args()


def prompts(llm: LLMEngine, count: int) -> list[list[int]]:
    out = []
    for i in range(count):
        code, edit = SNIPPETS[i % len(SNIPPETS)], EDITS[(i // len(SNIPPETS)) % len(EDITS)]
        text = f"Here is some Python code:\n\n```python\n{code}```\n\nRewrite the code: {edit}. Output the whole code."
        ids = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        out.append(list(ids))
    return out


def run(llm: LLMEngine, batch: list[list[int]], max_tokens: int) -> tuple[dict[str, list[int]], float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(batch))}
    start = time.perf_counter()
    for i, ids in enumerate(batch):
        llm.add_request(GenerateRequest(f"r{i}", ids, params))
    while llm.has_unfinished_requests():
        for output in llm.step():
            outputs[output.request_id] += output.new_token_ids
    return outputs, time.perf_counter() - start


def measure(name: str, llm: LLMEngine, streams: int, args, baseline: dict | None) -> dict:
    run(llm, prompts(llm, 1), 8)  # warm-up
    before = llm.stats()
    outputs, elapsed = run(llm, prompts(llm, streams), args.max_tokens)
    after = llm.stats()
    num_tokens = sum(len(t) for t in outputs.values())
    drafted = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    return {
        "engine": name,
        "streams": streams,
        "output_tokens": num_tokens,
        "elapsed_s": round(elapsed, 3),
        "tokens_per_s": round(num_tokens / elapsed, 2),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "identical_to_plain": None if baseline is None else outputs == baseline,
        "outputs": outputs,
    }


def main() -> None:
    args = parse_args()
    draft = Path(tempfile.mkdtemp(prefix="spec-draft-"))
    if "draft" in args.engines.split(","):
        bundled_draft(draft, args.draft_layers)
    k = args.k
    choices = {
        "plain": ("plain", None),
        "ngram": (f"ngram k={k}", SpeculativeConfig(method="ngram", num_speculative_tokens=k)),
        "ngram-limited": (
            f"ngram k={k}, disable_by_batch_size {args.limit}",
            SpeculativeConfig(method="ngram", num_speculative_tokens=k, disable_by_batch_size=args.limit),
        ),
        "draft": (
            f"draft model ({args.draft_layers} layers) k={k}",
            SpeculativeConfig(method="draft_model", model=str(draft), num_speculative_tokens=k),
        ),
    }
    engines = dict(choices[name] for name in args.engines.split(","))
    rows = []
    for streams in [int(s) for s in args.streams.split(",")]:
        baseline = None
        for name, spec in engines.items():
            llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=512 << 20, speculative=spec))
            row = measure(name, llm, streams, args, baseline)
            baseline = row["outputs"] if spec is None else baseline
            rows.append(row)
            print(
                f"{name} @ {streams}: {row['tokens_per_s']} tok/s, acceptance {row['acceptance_rate']}",
                flush=True,
            )
            del llm
    print_table(rows)
    meta = {
        "machine": platform.platform(),
        "processor": platform.processor(),
        "git": git_state(),
        "args": vars(args),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def print_table(rows: list[dict]) -> None:
    plain = {r["streams"]: r["tokens_per_s"] for r in rows if r["engine"] == "plain"}
    if not plain:
        plain = {r["streams"]: float("nan") for r in rows}
    print("\n| streams | engine | tok/s | vs plain | acceptance | drafted / accepted | output = plain |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rate = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.0%}"
        counts = f"{r['draft_tokens']} / {r['accepted_tokens']}" if r["draft_tokens"] else ""
        same = "" if r["identical_to_plain"] is None else ("yes" if r["identical_to_plain"] else "NO")
        speedup = r["tokens_per_s"] / plain[r["streams"]]
        print(
            f"| {r['streams']} | {r['engine']} | {r['tokens_per_s']} | {speedup:.2f}x | {rate} | {counts} | {same} |"
        )


if __name__ == "__main__":
    main()
