"""Servers running side by side, turns alternating between them, so that a slow minute of the machine slows
every server alike: one request per turn by default, or with `--concurrency N` a level of `--requests`
requests through N clients per turn (bench/serve.py's 16-client level, compared in alternation).

    env -u OPENBLAS_CORETYPE python bench/serve_paired.py [--servers ours,llama-server-f32] [--rounds 12]
        [--concurrency 1] [--requests 1] [--max-tokens 128] [--prompt-tokens 200]
        [--out bench/results/serve_paired.json]

`bench/serve.py` runs servers one after another, and on a shared 2-core machine two runs of one server
minutes apart differ by up to 30% at one client. Here every server starts first and stays up (at most one
of this server's variants: one Ray cluster); each round then sends one request to each, in turn, the order
reversed every other round, on the same prompts as bench/serve.py. While one server answers, every
process of the others is stopped (SIGSTOP, then SIGCONT): an idle Ray cluster takes about 0.13 cores,
llama-server next to nothing, and a cluster left running beside llama-server slowed it by up to 10% here.
A stopped Ray cluster catches up on its timers when it resumes, so each turn starts `--settle-s`
after the others stop. `--no-freeze` leaves them running. Prints per round each server's time per
output token (one client) or output tok/s over the level's wall time (several), the medians and the
first server's ratio to each, per round and its median; writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse
import asyncio
import os
import signal
import statistics
import time
import uuid
from contextlib import contextmanager

from bench import serve, serve_install, serve_load, serve_peers, serve_proc, serve_report


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="ours,llama-server-f32")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=1, help="clients per turn")
    ap.add_argument("--requests", type=int, default=1, help="requests per turn (at least --concurrency)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--request-timeout-s", type=float, default=180.0)
    ap.add_argument("--startup-timeout-s", type=float, default=300.0)
    ap.add_argument("--blas-threads", type=int, default=None)
    ap.add_argument("--config", default="serve_config.yaml")
    ap.add_argument("--base-port", type=int, default=8100)
    ap.add_argument("--reinstall", action="store_true")
    ap.add_argument("--llama-build", default=None)
    ap.add_argument("--settle-s", type=float, default=2.0, help="pause before each server's turn")
    ap.add_argument("--no-freeze", action="store_true", help="leave the idle servers' processes running")
    ap.add_argument("--out", default="bench/results/serve_paired.json")
    return ap.parse_args()


def one_turn(
    server: serve_proc.ServerProcess, bodies: list[dict], concurrency: int, timeout_s: float
) -> dict:
    """One level of `bodies` through `concurrency` clients; a failed request fails a one-client turn, and is
    counted (its tokens not) in a level of several."""
    level = asyncio.run(serve_load.run_level(server.base_url, bodies, concurrency, timeout_s)).summary()
    if level["num_errors"] and (concurrency == 1 or level["num_errors"] == len(bodies)):
        raise RuntimeError(f"{server.name}: {level['error_samples']}")
    return {
        "itl_ms": level["itl_mean_ms"],
        "ttft_ms": level["ttft_p50_ms"],
        "tok_s": level["aggregate_tok_s"],
        "chunk_gap_p50_ms": level["chunk_gap_p50_ms"],
        "num_errors": level["num_errors"],
    }


@contextmanager
def frozen(servers: list[serve_proc.ServerProcess]):
    """Every process of `servers` stopped for the block's duration."""
    pids = [pid for server in servers for pid in serve_proc.descendants(server.proc.pid)]
    send(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        send(pids, signal.SIGCONT)


def send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run_rounds(started: dict, env_info: dict, args) -> list[dict]:
    """started: name -> (server, peer, model ids). One request per server per round, alternating."""
    nonce, index, rounds = uuid.uuid4().hex[:8], 0, []
    names = list(started)
    for r in range(-1, args.rounds):  # round -1 warms every server up and is not kept
        row: dict = {"round": r}
        for name in names if r % 2 == 0 else names[::-1]:
            server, peer, model_ids = started[name]
            model = env_info["model_dir"] if peer.use_model_path else model_ids[0]
            extra = serve_peers.eos_body(peer, env_info["eos_token_ids"])
            max_tokens = 16 if r < 0 else args.max_tokens
            count = 1 if r < 0 else args.requests
            bodies = serve.bodies(model, extra, index, count, env_info["prompt_words"], max_tokens, nonce)
            index += count
            others = [] if args.no_freeze else [s for n, (s, _, _) in started.items() if n != name]
            with frozen(others):
                time.sleep(args.settle_s)  # the server was stopped during the last turn: its timers catch up
                row[name] = one_turn(server, bodies, args.clients if r >= 0 else 1, args.request_timeout_s)
        if r >= 0:
            rounds.append(row)
            key, unit = measure(args.clients)
            cells = ", ".join(f"{n} {row[n][key]:.2f}" for n in names)
            serve.log(f"round {r}: {unit}: {cells}")
    return rounds


def measure(concurrency: int) -> tuple[str, str]:
    """What a turn is compared by: one client's time per output token, or a level's output tok/s."""
    return ("itl_ms", "ms per output token") if concurrency == 1 else ("tok_s", "output tok/s")


def table(names: list[str], rounds: list[dict], concurrency: int = 1) -> str:
    """Per server: its turns' measure by round, the median, the median tok/s, and the first server's
    measure over its own per round, then the median: ITLs at one client (below 1: the first is faster),
    tok/s at several (above 1: the first is faster)."""
    key, unit = measure(concurrency)
    first = names[0]
    ratio_name = f"{first} ITL / its ITL" if key == "itl_ms" else f"{first} tok/s / its tok/s"
    header = f"| server | {unit}, by round | median | tok/s median | {ratio_name}, per round, median |"
    lines = [header, "|---|---|---|---|---|"]
    for name in names:
        values = [row[name][key] for row in rounds]
        tok_s = statistics.median(row[name]["tok_s"] for row in rounds)
        ratios = [row[first][key] / row[name][key] for row in rounds]
        cells = " / ".join(f"{x:.1f}" for x in values)
        ratio_cells = " / ".join(f"{x:.2f}" for x in ratios)
        lines.append(
            f"| {name} | {cells} | {statistics.median(values):.2f} | {tok_s:.1f} | "
            f"{ratio_cells}, **{statistics.median(ratios):.2f}x** |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    peers = [serve_peers.PEERS[n] for n in names]
    if sum(p.kind == "ours" for p in peers) > 1:
        raise SystemExit("at most one of this server's variants: they would share one Ray cluster")
    if args.requests < args.concurrency:
        raise SystemExit("--requests must be at least --concurrency")
    args.clients = args.concurrency  # serve.py's helpers read the strings below
    args.orders, args.concurrency, args.requests_per_level = 1, str(args.clients), str(args.requests)
    env_info = serve.setup()
    threads = serve.ours_blas_threads(serve.ours_config(REPO / args.config), env_info["blas_threads"])
    env_info["ours_blas_threads"], env_info["peer_blas_threads"] = threads, args.blas_threads or threads
    extra_words = max(10, args.prompt_tokens - env_info["tokens_at_50"])
    env_info["prompt_words"] = 50 + round(extra_words / env_info["tokens_per_word"])
    failed = serve_install.install_peers(names, env_info, args, serve.log)
    if failed:
        raise SystemExit(f"could not install: {failed}")
    started: dict = {}
    try:
        for index, (name, peer) in enumerate(zip(names, peers, strict=True)):
            server = serve.start_server(peer, env_info, args, index, 1)
            started[name] = (server, peer, serve_proc.wait_ready(server, args.startup_timeout_s))
            serve.log(f"[{name}] ready")
        rounds = run_rounds(started, env_info, args)
    finally:
        for server, _, _ in started.values():
            serve_proc.stop(server)
    print(table(names, rounds, args.clients))
    results = {"git": serve.git_state(), "machine": serve_report.machine(), "settings": vars(args) | env_info,
               "rounds": rounds}  # fmt: skip
    serve.write_results(results, args.out)


if __name__ == "__main__":
    main()
