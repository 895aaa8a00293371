"""Prefix-aware routing against power of two choices: two Scheduler replicas, chat requests that share
a few long system prompts, the real app started in this process.

    python bench/prefix_routing.py [--order prefix_aware,power_of_two] [--system-prompts 4]
                                   [--system-words 540] [--requests 48] [--concurrency 4]
                                   [--max-tokens 8] [--out bench/results/prefix_routing.json]

For each router in `--order`: `serve.run` the app (two one-thread Scheduler replicas), wait for
/v1/models, warm up, read /v1/status, send every request (streaming, greedy, `concurrency` at a
time, the system prompts interleaved: request i uses prompt i mod N), read /v1/status again,
`serve.delete` the app. The prefix-cache hit rate is the status delta of prompt tokens found over
prompt tokens looked up; TTFT is send -> first content delta, measured here. Prints a markdown table
and writes JSON. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

import httpx

from bench import serve_load, serve_proc, serve_report
from bench.serve import git_state

ROUTERS = ("prefix_aware", "power_of_two")
TOPICS = ["astronomy", "gardening", "sailing", "chess", "pottery", "cycling", "baking", "birding"]
STARTUP_TIMEOUT_S = 600


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--order", default=",".join(ROUTERS), help="routers to run, in this order")
    ap.add_argument("--system-prompts", type=int, default=4, help="distinct long system prompts")
    ap.add_argument(
        "--system-words", type=int, default=540, help="words per system prompt (~1.2 tokens each)"
    )
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--request-timeout-s", type=float, default=300.0)
    ap.add_argument("--out", default="bench/results/prefix_routing.json")
    args = ap.parse_args()
    args.order = [name.strip() for name in args.order.split(",") if name.strip()]
    unknown = set(args.order) - set(ROUTERS)
    if unknown:
        ap.error(f"unknown router(s) {sorted(unknown)}; pick from {', '.join(ROUTERS)}")
    return args


def app_args(router: str) -> dict[str, Any]:
    return {
        "engine": {"max_num_seqs": 16, "max_model_len": 2048, "kv_cache_memory_bytes": 128 * 1024 * 1024},
        "scheduler": {
            "num_replicas": 2,
            "num_cpus": 0.5,
            "num_threads": 1,  # two replicas share the two cores
            "max_ongoing_requests": 64,
            "request_router": router,
        },
        "tokenizer": {"num_cpus": 0.1},
        "embedder": {"enabled": False},
        "ingress": {"num_cpus": 0.1},
    }


def system_prompt(index: int, num_words: int) -> str:
    rng = random.Random(f"system-{index}")
    words = " ".join(rng.choice(serve_load.WORDS) for _ in range(num_words))
    topic = TOPICS[index % len(TOPICS)]
    return f"You are the {topic} assistant #{index}. Answer briefly. Reference notes: {words}."


def workload(args: argparse.Namespace, model: str) -> list[dict]:
    """Request i: system prompt i mod N (interleaved, so consecutive requests differ) and a distinct question."""
    systems = [system_prompt(i, args.system_words) for i in range(args.system_prompts)]
    bodies = []
    for i in range(args.requests):
        word = serve_load.WORDS[i % len(serve_load.WORDS)]
        messages = [
            {"role": "system", "content": systems[i % len(systems)]},
            {"role": "user", "content": f"Question {i}: what does the word '{word}' remind you of?"},
        ]
        bodies.append(serve_load.request_body(model, messages, args.max_tokens, {"ignore_eos": True}))
    return bodies


def warmup_bodies(model: str) -> list[dict]:
    """Short prompts sharing no block with the workload or each other (a system message of their own
    opens each, else the chat template's default one would be a shared first block); several, so
    that both replicas serve one."""
    return [
        serve_load.request_body(
            model,
            [{"role": "system", "content": f"Warm-up {i}."}, {"role": "user", "content": "Say hi."}],
            4,
            {},
        )
        for i in range(4)
    ]


def replica_rows(base_url: str) -> list[dict]:
    """The default model's per-replica rows of /v1/status (engine counters since each replica started)."""
    body = httpx.get(f"{base_url}/v1/status", timeout=60, trust_env=False).json()
    return body["replicas"]


def status_delta(before: list[dict], after: list[dict]) -> dict[str, Any]:
    """Per replica and in total: requests finished, prompt tokens looked up and found, between two reads."""
    old = {row["replica_id"]: row for row in before}
    keys = ("num_requests_finished", "prefix_cache_queries", "prefix_cache_hits")
    replicas = [
        {
            "replica_id": row["replica_id"],
            **{k: row[k] - old.get(row["replica_id"], {}).get(k, 0) for k in keys},
        }
        for row in after
    ]
    total = {k: sum(r[k] for r in replicas) for k in keys}
    queries = total["prefix_cache_queries"]
    total["hit_rate"] = total["prefix_cache_hits"] / queries if queries else None
    return {"total": total, "replicas": replicas}


def wait_models(base_url: str) -> list[str]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(f"{base_url}/v1/models", timeout=30, trust_env=False)
            if resp.status_code == 200:
                return [m["id"] for m in resp.json()["data"]]
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the app at {base_url} did not answer /v1/models within {STARTUP_TIMEOUT_S} s")


def run_router(router: str, args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    from ray import serve

    from deployments.app import build_app

    name = f"prefix-{router}"
    started = time.perf_counter()
    serve.run(build_app(app_args(router)), name=name, route_prefix="/")
    try:
        model = wait_models(base_url)[0]
        startup_s = time.perf_counter() - started
        timeout_s = args.request_timeout_s
        warm = asyncio.run(serve_load.run_level(base_url, warmup_bodies(model), 4, timeout_s))
        before = replica_rows(base_url)
        level = asyncio.run(
            serve_load.run_level(base_url, workload(args, model), args.concurrency, timeout_s)
        )
        delta = status_delta(before, replica_rows(base_url))
    finally:
        serve.delete(name)
    return {
        "router": router,
        "startup_s": startup_s,
        "warmup_errors": [r.error for r in warm.requests if not r.ok],
        "summary": level.summary(),
        "status_delta": delta,
        "requests": serve_load.result_dicts(level),
    }


def table(results: list[dict]) -> str:
    head = "| router | prefix-cache hit rate | TTFT p50 ms | TTFT p90 ms | wall s | requests per replica | errors |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in results:
        s, d = r["summary"], r["status_delta"]
        rate = d["total"]["hit_rate"]
        split = " / ".join(str(rep["num_requests_finished"]) for rep in d["replicas"])
        lines.append(
            f"| {r['router']} | {'-' if rate is None else f'{rate:.1%}'} | {s['ttft_p50_ms']:.0f} | "
            f"{s['ttft_p90_ms']:.0f} | {s['wall_s']:.1f} | {split} | {s['num_errors']}/{s['num_requests']} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    import ray
    from ray import serve

    # Ray starts workers at nice 15; on a shared machine the engines would yield to everything else.
    os.environ.setdefault("RAY_worker_niceness", "0")
    port = serve_proc.free_port()
    base_url = f"http://127.0.0.1:{port}"
    ray.init(
        address="local",  # a cluster of its own, never one that `ray start` left running
        num_cpus=os.cpu_count() or 2,
        object_store_memory=128 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
    )
    results = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for router in args.order:
            print(f"running {router} ...", flush=True)
            results.append(run_router(router, args, base_url))
            print(table(results[-1:]), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    report = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "app_args": app_args("<router>"),
        "machine": serve_report.machine(),
        "git": git_state(),
        "results": results,
    }
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print("\n" + table(results))
    print(f"\nprompt tokens per request (mean): {results[0]['summary']['prompt_tokens_mean']}; wrote {out}")


if __name__ == "__main__":
    main()
