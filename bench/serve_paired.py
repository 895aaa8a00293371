"""One client against servers running side by side: single requests alternating between them, so that a
slow minute of the machine slows every server alike.

    env -u OPENBLAS_CORETYPE python bench/serve_paired.py [--servers ours,llama-server-f32] [--rounds 12]
        [--max-tokens 128] [--prompt-tokens 200] [--out bench/results/serve_paired.json]

`bench/serve.py` runs servers one after another, and on a shared 2-core machine two runs of one server
minutes apart differ by up to 30% at one client. Here every server starts first and stays up (at most one
of this server's variants: one Ray cluster); each round then sends one request to each, in turn, the order
reversed every other round, on the same prompts as bench/serve.py. While one server answers, every
process of the others is stopped (SIGSTOP, then SIGCONT): an idle Ray cluster takes about 0.13 cores,
llama-server next to nothing, and a cluster left running beside llama-server slowed it by up to 10% here.
A stopped Ray cluster catches up on its timers when it resumes, so each turn starts `--settle-s`
after the others stop. `--no-freeze` leaves them running. Prints per-round time per output token and
each server's median, and writes JSON.
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


def one_request(server: serve_proc.ServerProcess, body: dict, timeout_s: float) -> dict:
    level = asyncio.run(serve_load.run_level(server.base_url, [body], 1, timeout_s)).summary()
    if level["num_errors"]:
        raise RuntimeError(f"{server.name}: {level['error_samples']}")
    return {
        "itl_ms": level["itl_mean_ms"],
        "ttft_ms": level["ttft_p50_ms"],
        "tok_s": level["aggregate_tok_s"],
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
            body = serve.bodies(model, extra, index, 1, env_info["prompt_words"], max_tokens, nonce)[0]
            index += 1
            others = [] if args.no_freeze else [s for n, (s, _, _) in started.items() if n != name]
            with frozen(others):
                time.sleep(args.settle_s)  # the server was stopped during the last turn: its timers catch up
                row[name] = one_request(server, body, args.request_timeout_s)
        if r >= 0:
            rounds.append(row)
            cells = ", ".join(f"{n} {row[n]['itl_ms']:.2f}" for n in names)
            serve.log(f"round {r}: ms per output token: {cells}")
    return rounds


def table(names: list[str], rounds: list[dict]) -> str:
    first = names[0]
    header = f"| server | ms per output token, by round | median | tok/s median | {first} ITL / its ITL, per round, median |"
    lines = [header, "|---|---|---|---|---|"]
    for name in names:
        itl = [row[name]["itl_ms"] for row in rounds]
        tok_s = statistics.median(row[name]["tok_s"] for row in rounds)
        ratio = statistics.median(row[first]["itl_ms"] / row[name]["itl_ms"] for row in rounds)
        cells = " / ".join(f"{x:.1f}" for x in itl)
        lines.append(f"| {name} | {cells} | {statistics.median(itl):.2f} | {tok_s:.1f} | {ratio:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    peers = [serve_peers.PEERS[n] for n in names]
    if sum(p.kind == "ours" for p in peers) > 1:
        raise SystemExit("at most one of this server's variants: they would share one Ray cluster")
    args.orders, args.concurrency, args.requests_per_level = 1, "1", "1"  # what serve.py's helpers read
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
    print(table(names, rounds))
    results = {"git": serve.git_state(), "machine": serve_report.machine(), "settings": vars(args) | env_info,
               "rounds": rounds}  # fmt: skip
    serve.write_results(results, args.out)


if __name__ == "__main__":
    main()
