"""Soak: N streaming clients for D seconds against this server, then proof that nothing was lost or leaked.

    . .venv/bin/activate
    python bench/soak.py                       # starts `serve run serve_config.yaml`
    python bench/soak.py --url http://127.0.0.1:8000 --app llm     # attaches to a running server

Mixed prompt and output lengths (bench/soak_load.py), a fraction cancelled mid-stream, a share with a
common system prompt (prefix-cache hits). Every few seconds it samples /v1/status (running, waiting,
KV blocks held) and the RSS of every replica process (bench/replica_procs.py). At the end it waits for
idle and checks that no replica runs, queues or holds a block, and fits each deployment's memory
slope after warm-up (MiB/min). Prints a table; writes bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import serve_proc
from bench.serve_report import recorded_out
from bench.soak_load import LoadConfig, run_load
from bench.soak_probe import memory_report, sample_until, samples_json, take_sample, wait_idle

IDLE_DEADLINE_S = 30.0


async def run_soak(
    base_url: str, app: str, load: LoadConfig, sample_interval_s: float = 5.0, warmup_s: float = 60.0
) -> dict:
    """Runs the load while sampling; returns the report (outcomes, idle check, memory, samples)."""
    started = time.monotonic()
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as client:
        sampler = asyncio.ensure_future(sample_until(client, app, started, sample_interval_s, stop))
        result = await run_load(base_url, load)
        load_s = time.monotonic() - started
        stop.set()
        samples = await sampler
        idle_total, idle_wait_s = await wait_idle(client, IDLE_DEADLINE_S)
        samples.append(await take_sample(client, app, started))
    idle = idle_total["num_running"] == 0 and idle_total["num_waiting"] == 0
    no_leak = idle_total["num_blocks_used"] == 0
    return {
        "config": asdict(load) | {"sample_interval_s": sample_interval_s, "warmup_s": warmup_s},
        "load_s": round(load_s, 1),
        "num_requests": result.num_requests,
        "outcomes": dict(result.outcomes),
        "errors": result.errors,
        "num_output_chunks": result.num_output_chunks,
        "idle_after_s": idle_wait_s,
        "idle": idle,
        "no_blocks_held": no_leak,
        "final_total": {k: idle_total.get(k) for k in _FINAL_KEYS},
        "memory": memory_report(samples, warmup_s),
        "ok": result.clean and idle and no_leak,
        "samples": samples_json(samples),
    }


_FINAL_KEYS = (
    "num_running",
    "num_waiting",
    "num_blocks_used",
    "num_blocks_free",
    "num_blocks_total",
    "num_preemptions",
    "num_requests_finished",
    "num_requests_by_finish_reason",
    "prefix_cache_hit_rate",
)


def print_report(report: dict) -> None:
    out = report["outcomes"]
    print(f"\nsoak: {report['num_requests']} requests in {report['load_s']} s: {out}")
    print(
        f"idle after {report['idle_after_s']} s: idle={report['idle']} no_blocks_held={report['no_blocks_held']}"
    )
    print(f"final: {report['final_total']}")
    print("\n| deployment | RSS after warm-up MiB | RSS end MiB | RSS max MiB | slope MiB/min | points |")
    print("|---|---|---|---|---|---|")
    for name, m in report["memory"].items():
        print(
            f"| {name} | {m['rss_after_warmup_mib']} | {m['rss_end_mib']} | {m['rss_max_mib']} "
            f"| {m['slope_mib_per_min']} | {m['num_points']} |"
        )
    for error in report["errors"]:
        print("  ", error)
    print("\nOK" if report["ok"] else "\nFAILED")


def start_server(config: Path, port: int) -> serve_proc.ServerProcess:
    env = serve_proc.ours_env(dict(os.environ)) | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [str(Path(sys.executable).parent / "serve"), "run", str(config)]
    log_path = Path.home() / ".cache/mlx-ray-serve/bench-logs/soak-serve.log"
    return serve_proc.start("ours", cmd, env, REPO, log_path, port, signal.SIGINT)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="attach to this server instead of starting one")
    p.add_argument("--app", default="llm", help="Serve application name (serve_config.yaml: llm)")
    p.add_argument("--config", default="serve_config.yaml", help="started with `serve run` without --url")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--shared-prefix-fraction", type=float, default=0.3)
    p.add_argument("--sample-interval-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "bench/results/soak.json"))
    return p.parse_args()


def recorded_command(argv: list[str]) -> str:
    """The command line as committed results show it: an --out outside the checkout by file name only."""
    words = list(argv)
    for i, word in enumerate(words):
        if word == "--out" and i + 1 < len(words):
            words[i + 1] = recorded_out(words[i + 1], REPO)
        elif word.startswith("--out="):
            words[i] = "--out=" + recorded_out(word.removeprefix("--out="), REPO)
    return " ".join(["python bench/soak.py", *words])


def main() -> int:
    args = parse_args()
    load = LoadConfig(
        args.clients, args.duration_s, args.cancel_fraction, args.shared_prefix_fraction, seed=args.seed
    )
    server = None
    url = args.url
    if url is None:
        import yaml

        config = (REPO / args.config).resolve()
        port = int((yaml.safe_load(config.read_text()).get("http_options") or {}).get("port", 8000))
        server = start_server(config, port)
        serve_proc.wait_ready(server, 600)
        url = server.base_url
    try:
        report = asyncio.run(run_soak(url, args.app, load, args.sample_interval_s, args.warmup_s))
    finally:
        if server is not None:
            serve_proc.stop(server)
    report["command"] = recorded_command(sys.argv[1:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print_report(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
