"""Many models behind one `serve run`: what an on-demand model costs and saves, on the shipped example.

    python bench/multi_model.py [--config examples/multi-model.yaml] [--idle-timeout-s 20]
                                [--rounds 3] [--out bench/results/multi_model.json]

Starts the config (its on-demand model's idle timeout shortened to --idle-timeout-s) with its own Ray
cluster on a free port, then measures: time to ready; memory of the process tree with the on-demand
model cold; TTFT of the always-on model; the on-demand model's first request (cold start: TTFT and the
keep-alives its stream got) and its warm TTFT after; memory with both loaded; and how long after its last
request it is back to zero replicas, with the memory then. Prints a table, writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse
import json
import os
import signal
import statistics
import tempfile
import time

import httpx
import yaml

from bench import serve_proc, serve_report

SERVE_CLI = str(Path(sys.executable).with_name("serve"))
PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


def main() -> None:
    args = _parse()
    config = yaml.safe_load((REPO / args.config).read_text())
    port = serve_proc.free_port()
    config["http_options"]["port"] = port
    models = config["applications"][0]["args"]["models"]
    on_demand = next(m for m in models if m.get("on_demand"))
    always = next(m for m in models if not m.get("on_demand") and m.get("kind", "text") != "embedding")
    on_demand["on_demand"]["idle_timeout_s"] = args.idle_timeout_s
    folder = Path(tempfile.mkdtemp(prefix="multi_model_"))
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = os.environ | {"RAY_ADDRESS": "local"}
    cmd = [SERVE_CLI, "run", str(folder / "config.yaml")]
    started = time.monotonic()
    server = serve_proc.start("multi-model", cmd, env, REPO, folder / "serve.log", port, signal.SIGINT)
    try:
        result = _measure(server, always["served_model_name"], on_demand["served_model_name"], started, args)
    finally:
        serve_proc.stop(server)
    result |= {"command": " ".join(sys.argv), "config": args.config, "machine": serve_report.machine()}
    print(_table(result))
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {serve_report.recorded_out(args.out, REPO)}")


def _measure(server: serve_proc.ServerProcess, always: str, on_demand: str, started: float, args) -> dict:
    url = server.base_url
    serve_proc.wait_ready(server, 600)
    _wait_state(url, always, "loaded", 600)
    result: dict = {"ready_s": round(time.monotonic() - started, 1), "states_at_start": _states(url)}
    result["rss_mib_cold"] = _tree_rss_mib(server)
    result["always_ttft_s"] = [_ttft(url, always)[0] for _ in range(args.rounds)]
    cold_ttft_s, keepalives = _ttft(url, on_demand)
    result |= {"cold_start_ttft_s": cold_ttft_s, "cold_start_keepalives": keepalives}
    result["on_demand_warm_ttft_s"] = [_ttft(url, on_demand)[0] for _ in range(args.rounds)]
    result["rss_mib_both_loaded"] = _tree_rss_mib(server)
    last_request_end = time.monotonic()
    _wait_state(url, on_demand, "cold", args.idle_timeout_s + 300)
    result["back_to_zero_after_s"] = round(time.monotonic() - last_request_end, 1)
    time.sleep(3)  # the stopped replica's process exits
    result["rss_mib_after_idle"] = _tree_rss_mib(server)
    result["idle_timeout_s"] = args.idle_timeout_s
    return result


def _ttft(url: str, model: str) -> tuple[float, int]:
    """Seconds to the first content chunk of a streamed chat request, and the keep-alives before it."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True}
    start, keepalives = time.monotonic(), 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        ttft = None
        for line in response.iter_lines():
            keepalives += line == ": keep-alive"
            if ttft is None and line.startswith("data: {") and '"content":"' in line:
                ttft = round(time.monotonic() - start, 3)
    assert ttft is not None, "no content arrived"
    return ttft, keepalives


def _states(url: str) -> dict[str, str]:
    cards = httpx.get(f"{url}/v1/models", timeout=60).json()["data"]
    return {card["id"]: card["state"] for card in cards}


def _wait_state(url: str, model: str, state: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _states(url).get(model) != state:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model} did not become {state} within {timeout_s:.0f} s")
        time.sleep(1)


def _tree_rss_mib(server: serve_proc.ServerProcess) -> float:
    total_kib = 0
    for pid in serve_proc.descendants(server.proc.pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total_kib += next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
        )
    return round(total_kib / 1024, 1)


def _table(r: dict) -> str:
    median = statistics.median
    rows = [
        ("ready (serve run -> always-on model loaded)", f"{r['ready_s']} s"),
        ("memory, on-demand model cold (process tree RSS)", f"{r['rss_mib_cold']} MiB"),
        ("always-on model TTFT p50", f"{median(r['always_ttft_s']):.3f} s"),
        ("on-demand model, first request TTFT (cold start)", f"{r['cold_start_ttft_s']:.1f} s"),
        ("  keep-alive comments its stream got meanwhile", str(r["cold_start_keepalives"])),
        ("on-demand model TTFT p50 once loaded", f"{median(r['on_demand_warm_ttft_s']):.3f} s"),
        ("memory, both loaded", f"{r['rss_mib_both_loaded']} MiB"),
        (f"back to zero replicas after its last request (idle timeout {r['idle_timeout_s']} s)",
         f"{r['back_to_zero_after_s']} s"),
        ("memory after it went idle", f"{r['rss_mib_after_idle']} MiB"),
    ]  # fmt: skip
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="examples/multi-model.yaml")
    parser.add_argument("--idle-timeout-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/multi_model.json")
    return parser.parse_args()


if __name__ == "__main__":
    main()
