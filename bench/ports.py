"""Which addresses the server listens on when started the README's way.

    python bench/ports.py [--config serve_config.yaml] [--ray-default] [--out bench/results/ports.json]

Starts `serve run <config>` with the README start's variables (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0:
Ray then takes the loopback address as the node's IP, so its metrics exporters, dashboard agent, GCS
and raylet bind only there; RAY_SERVE_ENABLE_HA_PROXY=1: HAProxy on the HTTP port), waits for
/health, lists every TCP socket that began listening since the start (`ss -ltnpH`, before and
after), prints them, writes JSON and stops the server. `--ray-default` starts it without them, for
comparison. Linux only (`ss` from iproute2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `bench` package.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

from bench.serve_proc import readme_start_env

LOOPBACK = ("127.", "[::1]", "[::ffff:127.")


def listeners() -> set[tuple[str, str]]:
    """(local address:port, process name) of every listening TCP socket."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        names = re.findall(r'\(\("([^"]+)"', line)
        found.add((fields[3], names[0] if names else "?"))
    return found


def wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="serve_config.yaml")
    ap.add_argument("--ray-default", action="store_true", help="start without the README's variables")
    ap.add_argument("--port", type=int, default=8000, help="the config's http_options.port")
    ap.add_argument("--out", default="bench/results/ports.json")
    args = ap.parse_args()
    before = listeners()
    start_env = {} if args.ray_default else readme_start_env()
    env = dict(os.environ, **start_env)
    serve = str(Path(sys.executable).parent / "serve")
    proc = subprocess.Popen([serve, "run", args.config], cwd=REPO, env=env, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{args.port}/health", 300)
        time.sleep(5)  # replicas open their gRPC ports as they initialize
        new = sorted(listeners() - before)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    rows = [{"address": a, "process": p, "loopback": a.startswith(LOOPBACK)} for a, p in new]
    print("| address | process | loopback only |\n|---|---|---|")
    for r in rows:
        print(f"| {r['address']} | {r['process']} | {'yes' if r['loopback'] else '**no**'} |")
    open_ = [r for r in rows if not r["loopback"]]
    print(f"\n{len(rows)} listening sockets, {len(open_)} beyond loopback")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    mode = " ".join(f"{k}={v}" for k, v in start_env.items()) or "ray default"
    Path(args.out).write_text(json.dumps({"mode": mode, "config": args.config, "listeners": rows}, indent=2))


if __name__ == "__main__":
    main()
