"""`serve run serve_config.yaml` as the README starts it: its own Ray cluster, the shipped config (on a
free port) behind HAProxy, every deployment healthy in `serve status`, the bundled model answering the SDKs,
OpenBLAS with the config's thread count in every process that runs MLX, and Ctrl-C ending it all.

The other e2e tests share one app built in-process (conftest.py); this one runs the user's command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from engine.platform.blas import blas_state

import httpx
import pytest
import yaml

from bench import serve_proc
from bench.serve_proc import readme_start_env

REPO = Path(__file__).resolve().parents[2]
SERVE_CLI = str(Path(sys.executable).with_name("serve"))
STARTUP_TIMEOUT_S = 300
_SIGINT_DEFAULT_EXEC = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[serve_proc.ServerProcess]:
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    port = serve_proc.free_port()
    config["http_options"]["port"] = port  # nothing else changes
    folder = tmp_path_factory.mktemp("serve_run")
    config_path = folder / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    # The README's variables; RAY_ADDRESS=local: a cluster of its own, never the one conftest.py started.
    env = serve_proc.ours_env(dict(os.environ))
    # As a terminal starts it: SIGINT at its default. A test run started in the background (`&` in a
    # script) inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored, so Ctrl-C would be lost.
    cmd = [sys.executable, "-c", _SIGINT_DEFAULT_EXEC, SERVE_CLI, "run", str(config_path)]
    server = serve_proc.start("serve-run", cmd, env, REPO, folder / "serve.log", port, signal.SIGINT)
    try:
        try:
            serve_proc.wait_ready(server, STARTUP_TIMEOUT_S)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{server.log_tail()}") from None
        yield server
    finally:
        serve_proc.stop(server)


def test_default_names_the_bundled_model_for_both_sdks(served):
    import anthropic
    import openai

    chat = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0).chat
    reply = chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    assert reply.model == "smollm2" and "Paris" in reply.choices[0].message.content
    message = anthropic.Anthropic(base_url=served.base_url, api_key="unused", max_retries=0).messages.create(
        model="default", max_tokens=8, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert message.content[0].text and message.usage.output_tokens > 0


def test_serve_status_shows_every_deployment_healthy(served):
    env = os.environ | {"RAY_AUTH_MODE": "token"}  # the README's advice for the CLI under token auth
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [SERVE_CLI, "status"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    app = yaml.safe_load(out.stdout)["applications"]["llm"]
    assert app["status"] == "RUNNING"
    statuses = {name: d["status"] for name, d in app["deployments"].items()}
    assert statuses == {
        name: "HEALTHY" for name in ("Ingress", "Scheduler", "Tokenizer", "Embedder", "ResponseStore")
    }


def test_every_mlx_process_runs_openblas_with_the_configured_threads(served):
    blas = blas_state()
    assert blas.path is not None, blas.reason
    report = serve_proc.blas_report(served, blas.path)
    assert report["ok"], report

    (replica,) = httpx.get(f"{served.base_url}/v1/status", timeout=30).json()["replicas"]
    compute = replica["compute"]
    assert compute["blas_detail"].endswith("2 threads")  # scheduler.num_threads: 2
    assert "DYNAMIC_ARCH" in compute["blas_config"] and compute["blas_core"] == blas.core
    assert compute["decode"] == "c_forward" and compute["prefill"] == "c_forward"


def test_the_readme_start_runs_the_engine_at_nice_0(served):
    assert readme_start_env()["RAY_worker_niceness"] == "0"
    (replica,) = httpx.get(f"{served.base_url}/v1/status", timeout=30).json()["replicas"]
    assert replica["compute"]["niceness"] == 0  # Ray's default for its workers is 15
    log = served.log_path.read_text(errors="replace")
    assert "engine for smollm2 loaded" in log  # the Scheduler's log reaches serve run's output
    assert "RAY_worker_niceness=0" not in log  # ... and its warning at any niceness above 0 is not there


def test_the_readme_start_serves_http_through_haproxy(served):
    assert readme_start_env()["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    argvs = [
        Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        for pid in serve_proc.descendants(served.proc.pid)
    ]
    haproxy = [[a.decode() for a in argv] for argv in argvs if argv[0].endswith(b"/haproxy")]
    assert len(haproxy) == 1, argvs  # Ray Serve's HAProxy holds the HTTP port, not its Python proxy
    config = Path(haproxy[0][haproxy[0].index("-f") + 1]).read_text()
    assert f":{served.base_url.rsplit(':', 1)[1]}\n" in config  # the port clients use
    assert "server SERVE_REPLICA_llm-Ingress" in config  # the Ingress replica serves HTTP behind it
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    with httpx.stream("POST", f"{served.base_url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2


def test_the_readme_start_slows_serves_controller_loop_and_metrics_export(served):
    readme = readme_start_env()
    wanted = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}
    assert {k: readme[k] for k in wanted} == wanted
    titles = {pid: serve_proc.command_line(pid) for pid in serve_proc.descendants(served.proc.pid)}
    controller = [pid for pid, title in titles.items() if title.startswith("ray::ServeController")]
    replicas = [pid for pid, title in titles.items() if title.startswith("ray::ServeReplica:llm:")]
    assert len(controller) == 1 and len(replicas) >= 4, titles  # Ingress, Scheduler, Tokenizer, Embedder, ...
    for pid in controller + replicas:  # each reads them once, from its environment, when Ray Serve loads
        assert {k: serve_proc.environ(pid).get(k) for k in wanted} == wanted, titles[pid]


def _stream_until_cut(url: str) -> None:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Count to a million."}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
            for _ in response.iter_lines():
                pass
    except httpx.HTTPError:
        pass  # cut by the shutdown: what this test wants


# Last in this module: it stops the server the tests above share.
def test_ctrl_c_ends_every_process_of_serve_run_within_30_s(served):
    streams = [threading.Thread(target=_stream_until_cut, args=(served.base_url,)) for _ in range(4)]
    for stream in streams:
        stream.start()
    time.sleep(5)  # the streams are decoding
    tree = serve_proc.descendants(served.proc.pid)
    assert len(tree) > 10  # serve run, Ray's GCS, raylet, dashboard, the replicas, ...
    os.killpg(served.proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
    deadline = time.monotonic() + 30
    while serve_proc.alive(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {pid: serve_proc.command_line(pid) for pid in serve_proc.alive(tree)}
    assert not left, f"still running 30 s after SIGINT: {left}"
    assert served.proc.wait(5) == 0
    for stream in streams:
        stream.join(30)
