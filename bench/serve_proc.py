"""Starts, checks and stops one benchmarked server process tree at a time.

Owns the server's process group, its log file, the readiness wait and the environment this server
starts with (the README start command's variables); it also proves from
/proc/<pid>/maps which processes of the tree run MLX and whether they loaded the patched OpenBLAS.
It signals only the processes it started and their descendants, by pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def readme_start_line() -> str:
    """The README's start command (its line that runs `serve run serve_config.yaml`)."""
    return next(
        ln for ln in (REPO / "README.md").read_text().splitlines() if "serve run serve_config.yaml" in ln
    )


def readme_start_env() -> dict[str, str]:
    """The NAME=value words before `serve run` in the README's start command."""
    words = readme_start_line().split("&&")[-1].split()
    return dict(w.split("=", 1) for w in words[: words.index("serve")])


def ours_env(base: dict[str, str]) -> dict[str, str]:
    """What `serve run` gets in a benchmark or a test: `base` with the README start's variables, a Ray
    cluster of its own (RAY_ADDRESS=local, never one another process started) and no usage stats."""
    env = {k: v for k, v in base.items() if k not in ("RAY_ADDRESS", "OPENBLAS_NUM_THREADS")}
    return env | readme_start_env() | {"RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass
class ServerProcess:
    name: str
    proc: subprocess.Popen
    log_path: Path
    base_url: str
    stop_signal: int = signal.SIGTERM  # `serve run` cleans up Serve and its Ray cluster on SIGINT

    def log_tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""


PORT_WAIT_S = 60.0


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "taken"
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, chosen by the kernel."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(name: str, cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, port: int,
          stop_signal: int = signal.SIGTERM) -> ServerProcess:  # fmt: skip
    # The server before may still be letting go of it (Ray's HTTP proxy outlives `serve run` briefly).
    deadline = time.monotonic() + PORT_WAIT_S
    while not port_is_free(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"port {port} on 127.0.0.1 is taken; free it or pass another --base-port")
        time.sleep(1.0)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    return ServerProcess(name, proc, log_path, f"http://127.0.0.1:{port}", stop_signal)


def wait_ready(server: ServerProcess, timeout_s: float) -> list[str]:
    """Polls GET /v1/models until it answers 200; returns the listed model ids (mlx-lm may list none)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode} before it was ready")
        try:
            resp = httpx.get(f"{server.base_url}/v1/models", timeout=5, trust_env=False)
            if resp.status_code == 200:
                return [m["id"] for m in resp.json().get("data", [])]
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{server.name} did not answer /v1/models within {timeout_s:.0f} s")


def descendants(root_pid: int) -> dict[int, str]:
    """pid -> start time (field 22 of /proc/<pid>/stat) of root_pid and every process below it."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _read(str(stat)).rsplit(")", 1)[-1].split()
        if len(fields) > 19:
            pid = int(stat.parent.name)
            children.setdefault(int(fields[1]), []).append(pid)
            starts[pid] = fields[19]
    out, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        out[pid] = starts.get(pid, "")
        todo.extend(children.get(pid, []))
    return out


def blas_report(server: ServerProcess, blas_path: str) -> dict:
    """For each process of the tree that mapped libmlx: did it map `blas_path`, with which thread count."""
    procs = []
    for pid in descendants(server.proc.pid):
        maps = _read(f"/proc/{pid}/maps")
        if "libmlx" not in maps:
            continue
        env = environ(pid)
        procs.append({
            "pid": pid,
            "cmd": command_line(pid),
            "patched_openblas_mapped": blas_path in maps,
            "other_openblas_mapped": sorted({ln.split()[-1] for ln in maps.splitlines()
                                             if "libopenblas" in ln and blas_path not in ln}),
            "OPENBLAS_NUM_THREADS_at_exec": env.get("OPENBLAS_NUM_THREADS"),
            "LD_PRELOAD": env.get("LD_PRELOAD"),
        })  # fmt: skip
    ok = bool(procs) and all(p["patched_openblas_mapped"] for p in procs)
    return {"ok": ok, "mlx_processes": procs}


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    """The environment `pid` was started with (/proc/<pid>/environ); {} if it is gone."""
    items = [kv.split("=", 1) for kv in _read(f"/proc/{pid}/environ").split("\0") if "=" in kv]
    return dict(items)


def stop(server: ServerProcess, grace_s: float = 45.0) -> None:
    """Signals the root (SIGINT for `serve run`), then SIGKILLs every process of the tree still alive."""
    tree = descendants(server.proc.pid)
    if server.proc.poll() is None:
        server.proc.send_signal(server.stop_signal)
        try:
            server.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    time.sleep(1)  # let children see their parent go and exit on their own
    for pid, start_time in tree.items():
        _kill_if_same(pid, start_time)
    if server.proc.poll() is None:
        server.proc.wait(10)


def alive(tree: dict[int, str]) -> list[int]:
    """The pids of `tree` (from `descendants`) still running as the same processes (same start time);
    a zombie no longer runs."""
    running = []
    for pid, start_time in tree.items():
        fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
        if len(fields) > 19 and fields[19] == start_time and fields[0] != "Z":
            running.append(pid)
    return running


def command_line(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()[:160]


def _kill_if_same(pid: int, start_time: str) -> None:
    """SIGKILL pid only if it is still the process seen before (same start time), never a reused pid."""
    if pid not in alive({pid: start_time}):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
