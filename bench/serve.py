"""HTTP serving benchmark: this server (`serve run serve_config.yaml`, or at other weights) against
mlx-lm, vllm-mlx, mlx-openai-server (same bundled model, same patched OpenBLAS) and llama.cpp's
`llama-server` and llama-cpp-python's server (the bundled Q4_1 GGUF and an f32 GGUF made from it),
all on the same prompts.

    python bench/serve.py [--servers ours,mlx-lm,vllm-mlx,mlx-openai-server] [--concurrency 1,4,16]
                          [--requests-per-level 8,8,32] [--max-tokens 128] [--prompt-tokens 200]
                          [--orders 2] [--llama-build DIR] [--out bench/results/serve.json]

Servers run one at a time (2-core machine): install or build (first run only), start, wait for
/v1/models, check BLAS, warm up with one request, run every concurrency level, stop; with
`--orders 2` the list runs again in reverse order. Prints a markdown table (TTFT p50/p90, time per
output token, chunk gaps p50/p90, aggregate output tok/s, completion tokens per request, the CPU time
per output token of the server's whole process tree and its largest processes, errors), a
comparison table with one row per server ("run 1 / run 2"), and writes everything to JSON.
Only 127.0.0.1 is ever contacted.
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

from bench import replica_procs, serve_install, serve_llama, serve_load, serve_peers, serve_proc, serve_report

SETUP_CODE = """
import engine, json, sys
from pathlib import Path
from engine.platform.blas import blas_state, default_blas_threads
from engine.models.default_model import bundled_gguf_path, resolve_model_path
from engine.platform.paths import cache_dir
from mlx_lm.utils import load_tokenizer
from bench.serve_load import make_messages
model_dir = resolve_model_path("bundled:smollm2-135m-instruct", "float32")
tok = load_tokenizer(Path(model_dir))
def count(n):
    return len(tok.apply_chat_template(make_messages(0, "calibrate", n), add_generation_prompt=True))
lo, hi = count(50), count(250)
print(json.dumps({"model_dir": str(model_dir), "gguf_path": str(bundled_gguf_path()), "blas_path": blas_state().path,
                  "blas_threads": default_blas_threads(), "cache_dir": str(cache_dir()),
                  "eos_token_ids": sorted(tok.eos_token_ids), "tokens_at_50": lo, "tokens_per_word": (hi - lo) / 200}))
"""


METRICS = {
    "ttft": "request sent -> first chunk with non-empty delta content",
    "itl": "(last content delta - first content delta) / (completion_tokens - 1), per request, then the mean",
    "chunk_gap": "time between two consecutive SSE chunks of one stream that carry content (after the "
    "first), pooled over the level's successful requests; p50 and p90",
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
        help="OPENBLAS_NUM_THREADS for the MLX peers, -t for llama.cpp's; default: what our Scheduler uses",
    )
    ap.add_argument("--config", default="serve_config.yaml", help="our server's Serve config")
    ap.add_argument("--base-port", type=int, default=8100, help="peers listen on base-port + index")
    ap.add_argument("--reinstall", action="store_true", help="rebuild the peers' virtualenvs")
    ap.add_argument(
        "--orders",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: run the server list, then again in reverse order; both are reported",
    )
    ap.add_argument(
        "--llama-build",
        default=os.environ.get("MLX_RAY_SERVE_BENCH_LLAMA_BUILD"),
        help="an existing llama.cpp cmake build directory (bin/llama-server, bin/llama-quantize; missing "
        "targets are built in it); default: built once under <cache>/bench-llama/build",
    )
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
    if peer.kind == "ours":  # started as the README starts it, with a Ray instance of its own
        return serve_proc.ours_env(env) | dict(peer.env)
    if not peer.uses_mlx:
        return env  # llama.cpp: ggml's own CPU kernels, its thread count on the command line
    # An empty, existing hub cache: mlx-lm's /v1/models scans it and fails with 500 when it is missing.
    hub = Path(env_info["cache_dir"]) / "bench-hf-hub"
    hub.mkdir(parents=True, exist_ok=True)
    threads = str(env_info["peer_blas_threads"])
    return env | {
        "HF_HUB_CACHE": str(hub),
        "LD_PRELOAD": env_info["blas_path"],
        "OPENBLAS_NUM_THREADS": threads,
    }


def start_server(
    peer: serve_peers.Peer, env_info: dict, args, index: int, run: int
) -> serve_proc.ServerProcess:
    cache = Path(env_info["cache_dir"])
    suffix = f"-run{run}" if args.orders > 1 else ""
    log_path = cache / "bench-logs" / f"{peer.name}{suffix}.log"
    env = server_env(peer, env_info)
    if peer.kind == "ours":
        config = ours_config_file(peer, args, cache)
        cmd = [str(Path(sys.executable).parent / "serve"), "run", str(config)]
        port = ours_port(ours_config(config))
        if peer.direct_ingress:  # the Ingress replica's own HTTP server takes the load; Ray's proxy stays
            port = args.base_port + index
            env |= {
                "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
                "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 8),
            }
        return serve_proc.start(peer.name, cmd, env, REPO, log_path, port, signal.SIGINT)
    inputs = serve_peers.ServeInputs(
        cache=cache,
        model_dir=env_info["model_dir"],
        ggufs={weights: Path(path) for weights, path in env_info.get("ggufs", {}).items()},
        llama_build=Path(env_info["llama_build"]["dir"]) if env_info.get("llama_build") else None,
        port=args.base_port + index,
        num_threads=env_info["peer_blas_threads"],
        # prompt + max_tokens with room for template and tokenizer differences, in 256-token steps
        ctx_per_slot=max(512, -(-(args.prompt_tokens + args.max_tokens + 64) // 256) * 256),
    )
    cmd = serve_peers.server_command(peer, inputs)
    return serve_proc.start(peer.name, cmd, env, log_path.parent, log_path, inputs.port)


def ours_config_file(peer: serve_peers.Peer, args, cache: Path) -> Path:
    """--config as is, or (a variant with its own model, engine fields or app args) a copy whose every
    app serves `peer.model` with `peer.engine`'s fields and `peer.app_args`."""
    config = (REPO / args.config).resolve()
    if peer.model is None and not peer.engine and not peer.app_args:
        return config
    data = ours_config(config)
    for app in data.get("applications", []):
        engine = (app.get("args") or {}).get("engine")
        if engine is None:
            raise RuntimeError(
                f"{config}: application {app.get('name')!r} has no args.engine to set {peer.name}'s "
                f"fields in; {peer.name} needs a single-model config"
            )
        engine.update({"model": peer.model} if peer.model else {}, **dict(peer.engine))
        app["args"].update(dict(peer.app_args))
    out = cache / "bench-configs" / f"{peer.name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def bodies(model: str, extra: dict, first: int, count: int, words: int, max_tokens: int, nonce: str) -> list:
    return [
        serve_load.request_body(model, serve_load.make_messages(first + i, nonce, words), max_tokens, extra)
        for i in range(count)
    ]


def bench_server(peer: serve_peers.Peer, env_info: dict, args, index: int, run: int) -> dict:
    result: dict = {
        "name": peer.name,
        "run": run,
        "model": served_model(peer, env_info, args),
        "eos_mode": peer.eos_mode,
        "load_average_before": serve_report.load_average(),
    }
    server = None
    try:
        t0 = time.monotonic()
        server = start_server(peer, env_info, args, index, run)
        result["command"] = server.proc.args
        result["env_overrides"] = {
            k: v for k, v in server_env(peer, env_info).items() if os.environ.get(k) != v
        }
        model_ids = serve_proc.wait_ready(server, args.startup_timeout_s)
        result["startup_s"] = time.monotonic() - t0
        result["versions"] = versions(peer, env_info)
        result["blas"] = blas(peer, server, env_info)
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


def served_model(peer: serve_peers.Peer, env_info: dict, args) -> str:
    if peer.kind == "ours":
        apps = ours_config(REPO / args.config).get("applications", [])
        return peer.model or str(((apps[0].get("args") or {}).get("engine") or {}).get("model"))
    if peer.weights:
        return env_info["ggufs"][peer.weights]
    return env_info["model_dir"]


def versions(peer: serve_peers.Peer, env_info: dict) -> dict[str, str | None]:
    if peer.kind == "llama-server":
        build = Path(env_info["llama_build"]["dir"])
        return {"llama-server": serve_llama.server_version(build), "source": serve_llama.LLAMA_CPP_PYTHON}
    python = (
        sys.executable if peer.kind == "ours" else str(peer.venv(Path(env_info["cache_dir"])) / "bin/python")
    )
    return serve_peers.installed_versions(python, peer.version_of)


def blas(peer: serve_peers.Peer, server: serve_proc.ServerProcess, env_info: dict) -> dict:
    if not peer.uses_mlx:
        return {
            "ok": None,
            "note": "no MLX: ggml's own CPU kernels",
            "num_threads": env_info["peer_blas_threads"],
        }
    report = serve_proc.blas_report(server, env_info["blas_path"])
    key = "ours_blas_threads" if peer.kind == "ours" else "peer_blas_threads"
    return report | {"openblas_num_threads": env_info[key]}


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
        cpu_before = replica_procs.tree_cpu_seconds(server.proc.pid)
        level = asyncio.run(
            serve_load.run_level(server.base_url, level_bodies, concurrency, args.request_timeout_s)
        )
        summary = level.summary()
        summary["cpu_ms_per_token"] = cpu_per_token(cpu_before, server.proc.pid, level)
        summary["requests"] = serve_load.result_dicts(level)
        result["levels"].append(summary)
        cpu = summary["cpu_ms_per_token"]
        log(f"[{peer.name}] conc {concurrency}: {summary['aggregate_tok_s'] or 0:.1f} tok/s, "
            f"TTFT p50 {summary['ttft_p50_ms'] or 0:.0f} ms, errors {summary['num_errors']}, "
            f"CPU {cpu.get('total', 0):.2f} ms/token ({serve_report.cpu_split(cpu)})")  # fmt: skip


def cpu_per_token(before: dict[str, float], root_pid: int, level: serve_load.LevelResult) -> dict[str, float]:
    """CPU ms per output token of the level, by process kind (bench/replica_procs.py) and in all:
    the server's whole process tree (for ours: Ray, every replica, HAProxy)."""
    tokens = sum(r.completion_tokens for r in level.requests if r.ok)
    after = replica_procs.tree_cpu_seconds(root_pid)
    used = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}
    if not tokens:
        return {}
    per_token = {k: round(v * 1000 / tokens, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1])}
    return per_token | {"total": round(sum(used.values()) * 1000 / tokens, 3)}


def run_servers(names: list[str], install_failed: dict[str, str], env_info: dict, args) -> list[dict]:
    """Every server once in the given order; with --orders 2, then again in reverse order."""
    servers = []
    for run, order in enumerate([names, names[::-1]][: args.orders], start=1):
        for name in order:
            if name in install_failed:
                servers.append({"name": name, "run": run, "error": install_failed[name]})
                continue
            log(f"[{name}] starting (run {run} of {args.orders})")
            peer = serve_peers.PEERS[name]
            servers.append(bench_server(peer, env_info, args, names.index(name), run))
    return servers


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
    install_failed = serve_install.install_peers(names, env_info, args, log)
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
    }
    results["servers"] = run_servers(names, install_failed, env_info, args)
    print(serve_report.markdown_table(results["servers"]))
    print()
    print(serve_report.comparison_table(results["servers"]))
    print()
    print(serve_report.notes(results["servers"]))
    write_results(results, args.out)


def write_results(results: dict, out_arg: str) -> None:
    out = REPO / out_arg if not Path(out_arg).is_absolute() else Path(out_arg)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Results are committed: the checkout becomes "." and the home directory "~", so no machine's
    # paths land in git.
    text = json.dumps(results, indent=2, default=str).replace(str(REPO), ".").replace(str(Path.home()), "~")
    out.write_text(text)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
