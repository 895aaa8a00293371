"""The coding agents people point at local servers, run headless as shipped against `serve run`:
Claude Code (`claude -p`, /v1/messages), Codex CLI (`codex exec`, /v1/responses) and opencode
(`opencode run`, /v1/chat/completions), each with its full real prompt (system prompt and every tool).

The server runs `testing:tiny-64k` (engine/models/tiny_model.py): real agent prompts (Claude Code's is
about 12k tokens) overflow the bundled model's 8k window. Every exchange goes through a recording proxy,
so a test sees each request the client made and its status; any connection the clients try to open to
the outside world goes to a trap (their HTTP(S)_PROXY), and their own switches turn telemetry, update
checks and model-list fetches off. The clients come from npm, installed by .ci/run (AGENTS_DIR).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench import serve_proc
from tests.e2e.recording_proxy import Exchange, Recorder, start_proxy, start_trap, url_of

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = Path(os.environ.get("MLX_RAY_SERVE_AGENTS_DIR", REPO / ".ci" / "agents"))
SERVE_CLI = str(Path(sys.executable).with_name("serve"))
MODEL = "tiny-agents"
MAX_MODEL_LEN = 32768
CLIENT_TIMEOUT_S = 420
PROMPT = "Reply with one short sentence: what is 2 + 2?"


def agent_bin(name: str) -> str:
    path = AGENTS_DIR / "node_modules" / ".bin" / name
    if not path.exists():
        message = f"{name} is not installed in {AGENTS_DIR}: run .ci/run, or its npm install line"
        if os.environ.get("MLX_RAY_SERVE_REQUIRE_AGENTS"):
            pytest.fail(message)
        pytest.skip(message)
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[serve_proc.ServerProcess]:
    """The shipped config with the long-context test model, clamped max_tokens (opencode asks for more
    than the window holds) and a smaller KV pool."""
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    port = serve_proc.free_port()
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args["engine"] |= {
        "model": "testing:tiny-64k",
        "served_model_name": MODEL,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": 2048,
        "kv_cache_memory_bytes": 256 << 20,
    }
    args["embedder"]["enabled"] = False
    args["compatibility"] = {"max_tokens_policy": "clamp"}
    folder = tmp_path_factory.mktemp("agents_serve")
    config_path = folder / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = os.environ | {"RAY_ADDRESS": "local"}  # a cluster of its own, as tests/e2e/test_serve_run.py
    server = serve_proc.start("serve-run", [SERVE_CLI, "run", str(config_path)], env, REPO,
                              folder / "serve.log", port, signal.SIGINT)  # fmt: skip
    try:
        try:
            serve_proc.wait_ready(server, 600)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{server.log_tail()}") from None
        yield server
    finally:
        serve_proc.stop(server)


@pytest.fixture()
def proxy(served) -> Iterator[tuple[str, Recorder]]:
    server, recorder = start_proxy(served.base_url)
    yield url_of(server), recorder
    server.shutdown()


@pytest.fixture()
def trap() -> Iterator[tuple[dict[str, str], Recorder]]:
    server, recorder = start_trap()
    url = url_of(server)
    env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "ALL_PROXY": url, "NO_PROXY": "127.0.0.1,localhost"}
    yield env | {name.lower(): value for name, value in env.items()}, recorder
    server.shutdown()


def assert_stayed_home(trap_recorder: Recorder, allowed: tuple[str, ...] = ()) -> None:
    """Nothing tried to leave the machine, except `allowed` hosts (refused by the trap all the same)."""
    tried = [f"{e.method} {e.path}" for e in trap_recorder.exchanges if e.path not in allowed]
    assert not tried, tried


def run_client(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd,
        check=False,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"exit {done.returncode}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
    )
    return done


def base_env(home: Path, trap_env: dict[str, str]) -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TERM") if name in os.environ}
    return keep | trap_env | {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


def model_calls(recorder: Recorder, path: str) -> list[Exchange]:
    calls = [e for e in recorder.exchanges if e.method == "POST" and e.path.split("?")[0] == path]
    assert calls, [f"{e.method} {e.path}" for e in recorder.exchanges]
    return calls


def assert_nothing_refused(recorder: Recorder) -> None:
    refused = [(e.method, e.path, e.status, e.response[:500]) for e in recorder.exchanges if e.status >= 400]
    # GET /v1/models/<name> of a name this server does not serve is a lookup, not a refusal of work.
    assert not [r for r in refused if r[0] != "GET"], refused


def test_claude_code(proxy, trap, tmp_path):
    url, recorder = proxy
    env = base_env(tmp_path, trap[0]) | {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-local",
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    done = run_client([agent_bin("claude"), "-p", PROMPT, "--output-format", "json"], env, tmp_path)
    assert_stayed_home(trap[1])
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["subtype"] == "success" and result["result"].strip()
    assert_nothing_refused(recorder)
    calls = model_calls(recorder, "/v1/messages")
    main = max(calls, key=lambda e: len(e.json()["tools"]) if e.json() and "tools" in e.json() else 0)
    body = main.json()
    assert len(body["tools"]) >= 10 and body["system"], "the full prompt: system and every tool"
    assert result["usage"]["input_tokens"] > 8192, (
        "over the bundled model's window, so the long model matters"
    )


def test_codex_exec(proxy, trap, tmp_path):
    url, recorder = proxy
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "local"\ncheck_for_update_on_startup = false\n\n'
        f'[model_providers.local]\nname = "local"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "LOCAL_API_KEY"\n\n[analytics]\nenabled = false\n\n'
        # Plugins sync a marketplace from github.com and chatgpt.com at start (seen through the trap).
        "[features]\nplugins = false\n"
    )
    env = base_env(tmp_path, trap[0]) | {"CODEX_HOME": str(home), "LOCAL_API_KEY": "sk-local"}
    cmd = [agent_bin("codex"), "exec", "--skip-git-repo-check", PROMPT]
    done = run_client(cmd, env, tmp_path)
    assert done.stdout.strip(), done.stderr[-2000:]
    assert_stayed_home(trap[1])
    assert_nothing_refused(recorder)
    body = model_calls(recorder, "/v1/responses")[0].json()
    system = body.get("instructions") or [
        i for i in body["input"] if i.get("role") in ("developer", "system")
    ]
    assert len(body["tools"]) >= 3 and system, "the full prompt: its instructions and every tool"


def test_opencode_run(proxy, trap, tmp_path):
    url, recorder = proxy
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "local",
        "options": {"baseURL": f"{url}/v1", "apiKey": "sk-local"},
        # Limits above the served window (as a user copying a model card's figures writes them): opencode
        # asks for max_tokens 32000, over the room its prompt leaves, which max_tokens_policy 'clamp'
        # lowers (with 'error' it was a 400, after which opencode compacted and retried forever).
        "models": {MODEL: {"name": MODEL, "limit": {"context": 2 * MAX_MODEL_LEN, "output": 32000}}},
    }
    config = {
        "provider": {"local": provider},
        "model": f"local/{MODEL}",
        "small_model": f"local/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
    }
    (tmp_path / "opencode.json").write_text(json.dumps(config))
    env = base_env(tmp_path, trap[0]) | {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    done = run_client([agent_bin("opencode"), "run", PROMPT], env, tmp_path)
    assert done.stdout.strip(), done.stderr[-2000:]
    # opencode 1.18.33 installs its plugin SDK (@opencode-ai/plugin) into its config folder in the
    # background, with no switch to turn that off; the trap refuses it and opencode works on.
    assert_stayed_home(trap[1], allowed=("registry.npmjs.org:443",))
    assert_nothing_refused(recorder)
    calls = model_calls(recorder, "/v1/chat/completions")
    main = max(calls, key=lambda e: len((e.json() or {}).get("tools", [])))
    assert len(main.json()["tools"]) >= 5 and main.json()["messages"][0]["role"] == "system"
    prompt_tokens = int(re.findall(rb'"prompt_tokens":(\d+)', main.response)[-1])
    assert prompt_tokens + main.json()["max_tokens"] > MAX_MODEL_LEN, "over the window: clamped, not refused"
