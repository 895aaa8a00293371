"""HTTP serving benchmark: this server (`serve run serve_config.yaml`) against mlx-lm, vllm-mlx and
mlx-openai-server on the same bundled model, the same patched OpenBLAS and the same prompts.

    python bench/serve.py [--servers ours,mlx-lm,vllm-mlx,mlx-openai-server] [--concurrency 1,4,16]
                          [--requests-per-level 8,8,32] [--max-tokens 128] [--prompt-tokens 200]
                          [--out bench/results/serve.json]

Servers run one at a time (2-core machine): install (first run only), start, wait for /v1/models,
check BLAS, warm up with one request, run every concurrency level, stop. Prints a markdown table
(TTFT p50/p90, time per output token, aggregate output tok/s, completion tokens per request,
errors) and writes everything to JSON. Only 127.0.0.1 is ever contacted.
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
import signal
import subprocess
import time
import uuid

import yaml

from bench import serve_load, serve_peers, serve_proc, serve_report

SETUP_CODE = """
import engine, json, sys
from pathlib import Path
from engine.platform.blas import blas_state, default_blas_threads
from engine.models.default_model import resolve_model_path
from engine.platform.paths import cache_dir
from mlx_lm.utils import load_tokenizer
from bench.serve_load import make_messages
model_dir = resolve_model_path("bundled:smollm2-135m-instruct", "float32")
tok = load_tokenizer(Path(model_dir))
def count(n):
    return len(tok.apply_chat_template(make_messages(0, "calibrate", n), add_generation_prompt=True))
lo, hi = count(50), count(250)
print(json.dumps({"model_dir": str(model_dir), "blas_path": blas_state().path,
                  "blas_threads": default_blas_threads(), "cache_dir": str(cache_dir()),
                  "eos_token_ids": sorted(tok.eos_token_ids), "tokens_at_50": lo, "tokens_per_word": (hi - lo) / 200}))
"""


METRICS = {
    "ttft": "request sent -> first chunk with non-empty delta content",
    "itl": "(last content delta - first content delta) / (completion_tokens - 1), per request, then the mean",
    "aggregate_tok_s": "completion tokens of all successful requests / level wall time (first send to last end)",
    "completion_tokens": "usage.completion_tokens of the final chunk (stream_options.include_usage); "
    "the number of content deltas where a server sends no usage",
}


def git_state() -> dict:
    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty_files": len(git("status", "--porcelain").splitlines())}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="ours,mlx-lm,vllm-mlx,mlx-openai-server")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests-per-level", default="8,8,32", help="one number, or one per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=200, help="templated prompt length to aim for")
    ap.add_argument("--request-timeout-s", type=float, default=180.0)
    ap.add_argument("--startup-timeout-s", type=float, default=300.0)
    ap.add_argument(
        "--blas-threads",
        type=int,
        default=None,
        help="OPENBLAS_NUM_THREADS for the peers; default: what our Scheduler uses",
    )
    ap.add_argument("--config", default="serve_config.yaml", help="our server's Serve config")
    ap.add_argument("--base-port", type=int, default=8100, help="peers listen on base-port + index")
    ap.add_argument("--reinstall", action="store_true", help="rebuild the peers' virtualenvs")
    ap.add_argument("--out", default="bench/results/serve.json")
    return ap.parse_args()


def levels(args: argparse.Namespace) -> list[tuple[int, int]]:
    conc = [int(x) for x in args.concurrency.split(",")]
    reqs = [int(x) for x in args.requests_per_level.split(",")]
    if len(reqs) == 1:
        reqs = reqs * len(conc)
    if len(reqs) != len(conc):
        raise SystemExit(f"--requests-per-level has {len(reqs)} numbers for {len(conc)} concurrency levels")
    return list(zip(conc, reqs))


def setup() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SETUP_CODE], cwd=REPO, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"could not resolve the model and BLAS through the engine:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ours_config(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def ours_port(config: dict) -> int:
    return int((config.get("http_options") or {}).get("port", 8000))


def ours_blas_threads(config: dict, default: int) -> int:
    """What our Scheduler runs with: `scheduler.num_threads` (set through its runtime_env), else
    engine/platform/blas.py's default_blas_threads(), set in-process (so /proc/<pid>/environ cannot show it)."""
    for app in config.get("applications", []):
        threads = ((app.get("args") or {}).get("scheduler") or {}).get("num_threads")
        if threads:
            return int(threads)
    return default


def server_env(peer: serve_peers.Peer, env_info: dict) -> dict[str, str]:
    drop = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS", "VIRTUAL_ENV", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if peer.name == "ours":
        # RAY_ADDRESS=local: always a private Ray instance, never one that another process started.
        # RAY_worker_niceness=0: Ray runs workers at nice 15, which on a busy box would put our engine
        # behind every other process while the peers run at nice 0.
        return env | {"RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}
    # An empty, existing hub cache: mlx-lm's /v1/models scans it and fails with 500 when it is missing.
    hub = Path(env_info["cache_dir"]) / "bench-hf-hub"
    hub.mkdir(parents=True, exist_ok=True)
    threads = str(env_info["peer_blas_threads"])
    return env | {
        "HF_HUB_CACHE": str(hub),
        "LD_PRELOAD": env_info["blas_path"],
        "OPENBLAS_NUM_THREADS": threads,
    }


def start_server(peer: serve_peers.Peer, env_info: dict, args, index: int) -> serve_proc.ServerProcess:
    cache = Path(env_info["cache_dir"])
    log_path = cache / "bench-logs" / f"{peer.name}.log"
    env = server_env(peer, env_info)
    if peer.name == "ours":
        config = (REPO / args.config).resolve()
        cmd = [str(Path(sys.executable).parent / "serve"), "run", str(config)]
        port = ours_port(ours_config(config))
        return serve_proc.start(peer.name, cmd, env, REPO, log_path, port, signal.SIGINT)
    port = args.base_port + index
    cmd = serve_peers.server_command(peer, cache, env_info["model_dir"], port)
    return serve_proc.start(peer.name, cmd, env, log_path.parent, log_path, port)


def install_peers(names: list[str], env_info: dict, args) -> dict[str, str]:
    """Builds every venv before any server starts, so installs never overlap a measurement."""
    failed = {}
    for name in names:
        if name == "ours":
            continue
        try:
            serve_peers.ensure_venv(serve_peers.PEERS[name], Path(env_info["cache_dir"]), args.reinstall, log)
        except (RuntimeError, OSError, StopIteration) as exc:
            failed[name] = f"install failed: {exc}"
            log(f"[{name}] {failed[name]}")
    return failed


def bodies(model: str, extra: dict, first: int, count: int, words: int, max_tokens: int, nonce: str) -> list:
    return [
        serve_load.request_body(model, serve_load.make_messages(first + i, nonce, words), max_tokens, extra)
        for i in range(count)
    ]


def bench_server(peer: serve_peers.Peer, env_info: dict, args, index: int) -> dict:
    result: dict = {
        "name": peer.name,
        "eos_mode": peer.eos_mode,
        "load_average_before": serve_report.load_average(),
    }
    python = (
        sys.executable if peer.name == "ours" else str(peer.venv(Path(env_info["cache_dir"])) / "bin/python")
    )
    server = None
    try:
        t0 = time.monotonic()
        server = start_server(peer, env_info, args, index)
        result["command"] = server.proc.args
        result["env_overrides"] = {
            k: v for k, v in server_env(peer, env_info).items() if os.environ.get(k) != v
        }
        model_ids = serve_proc.wait_ready(server, args.startup_timeout_s)
        result["startup_s"] = time.monotonic() - t0
        result["versions"] = serve_peers.installed_versions(python, peer.version_of)
        result["blas"] = serve_proc.blas_report(server, env_info["blas_path"])
        key = "ours_blas_threads" if peer.name == "ours" else "peer_blas_threads"
        result["blas"]["openblas_num_threads"] = env_info[key]
        run_levels(server, peer, model_ids, env_info, args, result)
    except Exception as exc:  # noqa: BLE001  (one server failing must not stop the others)
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["log_tail"] = server.log_tail() if server else None
        log(f"[{peer.name}] FAILED: {result['error']}")
    finally:
        if server:
            serve_proc.stop(server)
            result["log"] = str(server.log_path)
        result["load_average_after"] = serve_report.load_average()
    return result


def run_levels(server, peer, model_ids: list[str], env_info: dict, args, result: dict) -> None:
    model = env_info["model_dir"] if peer.use_model_path else model_ids[0]
    extra = serve_peers.eos_body(peer, env_info["eos_token_ids"])
    words, nonce, first = env_info["prompt_words"], uuid.uuid4().hex[:8], 0
    warm = bodies(model, extra, 10_000, 1, words, 16, nonce)
    warm_level = asyncio.run(serve_load.run_level(server.base_url, warm, 1, args.request_timeout_s))
    result["warmup"] = warm_level.summary()
    if warm_level.summary()["num_errors"]:
        raise RuntimeError(f"warm-up request failed: {warm_level.summary()['error_samples']}")
    result["levels"] = []
    for concurrency, count in levels(args):
        level_bodies = bodies(model, extra, first, count, words, args.max_tokens, nonce)
        first += count
        level = asyncio.run(
            serve_load.run_level(server.base_url, level_bodies, concurrency, args.request_timeout_s)
        )
        summary = level.summary()
        summary["requests"] = serve_load.result_dicts(level)
        result["levels"].append(summary)
        log(f"[{peer.name}] conc {concurrency}: {summary['aggregate_tok_s'] or 0:.1f} tok/s, "
            f"TTFT p50 {summary['ttft_p50_ms'] or 0:.0f} ms, errors {summary['num_errors']}")  # fmt: skip


def main() -> None:
    # SIGTERM becomes SystemExit, so the `finally` in bench_server still stops the running server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse_args()
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [n for n in names if n not in serve_peers.PEERS]
    if unknown:
        raise SystemExit(f"unknown servers {unknown}; choose from {sorted(serve_peers.PEERS)}")
    env_info = setup()
    ours_threads = ours_blas_threads(ours_config(REPO / args.config), env_info["blas_threads"])
    env_info["ours_blas_threads"] = ours_threads
    env_info["peer_blas_threads"] = args.blas_threads or ours_threads
    extra_words = max(10, args.prompt_tokens - env_info["tokens_at_50"])
    env_info["prompt_words"] = 50 + round(extra_words / env_info["tokens_per_word"])
    log(
        f"model {env_info['model_dir']}, BLAS {env_info['blas_path']}, {env_info['prompt_words']} words/prompt"
    )
    results = {
        "metrics": METRICS,
        "git": git_state(),
        "machine": serve_report.machine(),
        "settings": {
            **vars(args),
            "out": serve_report.recorded_out(args.out, REPO),
            "levels": levels(args),
            **env_info,
        },
        "servers": [],
    }
    install_failed = install_peers(names, env_info, args)
    for index, name in enumerate(names):
        if name in install_failed:
            results["servers"].append({"name": name, "error": install_failed[name]})
            continue
        log(f"[{name}] starting")
        results["servers"].append(bench_server(serve_peers.PEERS[name], env_info, args, index))
    print(serve_report.markdown_table(results["servers"]))
    print()
    print(serve_report.notes(results["servers"]))
    out = REPO / args.out if not Path(args.out).is_absolute() else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Results are committed: the checkout becomes "." and the home directory "~", so no machine's
    # paths land in git.
    text = json.dumps(results, indent=2, default=str).replace(str(REPO), ".").replace(str(Path.home()), "~")
    out.write_text(text)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
