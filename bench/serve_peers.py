"""The servers `bench/serve.py` compares: how each is installed, started and asked to ignore EOS.

Owns the per-peer virtualenvs under `<cache>/bench-venvs/<peer>` (built once, reused after) and the
exact command line of every server; it never starts a process that serves (bench/serve_proc.py does)
and never builds llama.cpp (bench/serve_llama.py does).

The MLX peers run MLX's Linux CPU backend (`mlx[cpu]`), pinned to the version tested here so reruns
compare the same code; `--reinstall` rebuilds a venv. The llama.cpp peers run one GGUF each, at two
weights: the bundled Q4_1 and a float32 one made from it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# Pins: the versions this benchmark was written against (checked with `--help` and their source).
MLX_LM = "mlx-lm==0.32.2"
VLLM_MLX = "vllm-mlx==0.6.0"
MLX_OPENAI_SERVER = "mlx-openai-server==1.8.1"
LLAMA_CPP_PYTHON_SERVER = "llama-cpp-python[server]==0.3.36"  # compiled from the sdist (~15 min, 2 cores)
# mflux (image generation) has no Linux build; mlx-openai-server imports it only for image models.
SKIPPED_REQUIREMENTS = {"mflux"}
# Our server at other weights: `engine.model` replacing the one in --config.
OURS_MODELS = {
    "ours-q8": "bundled:smollm2-135m-instruct-8bit",
    "ours-q4": "bundled:smollm2-135m-instruct-q4",
}
LLAMA_KINDS = ("llama-server", "llama-cpp-python")
LLAMA_WEIGHTS = ("q4_1", "f32")  # the bundled GGUF, and that GGUF dequantized to float32
LLAMA_SERVER_SLOTS = 16  # --parallel: one slot per client at the highest concurrency of the issue


@dataclass(frozen=True)
class Peer:
    name: str
    kind: str  # which server program: "ours", one of LLAMA_KINDS, or an MLX peer's name
    packages: list[str]  # what `pip install` gets; [] for ours and llama-server
    version_of: list[str]  # distributions whose versions go into the JSON
    # Extra body fields that stop the server from ending at EOS ("ignore_eos" where it is accepted,
    # else a -100 logit bias on the EOS ids, filled in by `eos_body`).
    eos_mode: str
    no_deps_package: str | None = None  # installed --no-deps, its requirements minus SKIPPED_REQUIREMENTS
    use_model_path: bool = False  # send the model directory as `model` (mlx-lm loads any other name)
    model: str | None = None  # ours: the engine.model to serve; None keeps the config's
    weights: str | None = None  # llama.cpp peers: a key of LLAMA_WEIGHTS
    venv_name: str | None = None  # one venv for the weight variants of a peer; None: the peer's name
    install_env: dict[str, str] = field(default_factory=dict)  # extra environment for `pip install`
    # ours: started with Ray Serve's direct ingress (each Ingress replica serves HTTP on its own port,
    # no hop through Ray's proxy), and loaded on that port
    direct_ingress: bool = False
    # ours: EngineConfig fields set on top of the config's (e.g. a fast path off, for an A/B in one run)
    engine: tuple[tuple[str, object], ...] = ()
    # ours: environment of `serve run` set on top of bench/serve.py's (e.g. Ray's worker niceness)
    env: tuple[tuple[str, str], ...] = ()
    # ours: app args (deployments/app.py's AppConfig) set on top of the config's
    app_args: tuple[tuple[str, object], ...] = ()

    def venv(self, cache: Path) -> Path:
        return cache / "bench-venvs" / (self.venv_name or self.name)

    @property
    def uses_mlx(self) -> bool:
        return self.kind not in LLAMA_KINDS


@dataclass(frozen=True)
class ServeInputs:
    """What a peer's command line needs besides the peer itself."""

    cache: Path
    model_dir: str  # the float32 MLX model directory our engine builds (the MLX peers load it)
    ggufs: dict[str, Path]  # weights -> GGUF file (llama.cpp peers)
    llama_build: Path | None  # cmake build directory holding bin/llama-server
    port: int
    num_threads: int  # llama.cpp's -t / --n_threads: the BLAS thread count the MLX servers get
    ctx_per_slot: int  # llama-server context per slot: prompt + max_tokens with room to spare


def _llama_peers() -> dict[str, Peer]:
    peers = {}
    for weights in LLAMA_WEIGHTS:
        # llama-server honours `ignore_eos` (it adds a -inf bias on every end-of-generation token).
        name = f"llama-server-{weights}"
        peers[name] = Peer(name, "llama-server", [], [], "ignore_eos", weights=weights)
        # llama-cpp-python's server has no `ignore_eos`; it applies `logit_bias` (token ids as keys).
        name = f"llama-cpp-python-{weights}"
        peers[name] = Peer(name, "llama-cpp-python", [LLAMA_CPP_PYTHON_SERVER], ["llama-cpp-python"],
                           "logit_bias", weights=weights, venv_name="llama-cpp-python",
                           install_env={"CMAKE_ARGS": "-DGGML_NATIVE=ON -DLLAMA_CURL=OFF"})  # fmt: skip
    return peers


OURS_VERSIONS = ["mlx-ray-serve", "mlx", "mlx-lm", "ray"]
PEERS: dict[str, Peer] = {
    "ours": Peer("ours", "ours", [], OURS_VERSIONS, "ignore_eos"),
    **{name: Peer(name, "ours", [], OURS_VERSIONS, "ignore_eos", model=m) for name, m in OURS_MODELS.items()},
    **{
        f"{name}-direct": Peer(
            f"{name}-direct", "ours", [], OURS_VERSIONS, "ignore_eos", model=m, direct_ingress=True
        )
        for name, m in {"ours": None, **OURS_MODELS}.items()
    },
    # the float32 head read whole for greedy rows too (engine.cpu_greedy_screen off): the baseline of
    # the screened head (engine/runner/cpu/cpu_greedy.h)
    "ours-full-head": Peer(
        "ours-full-head", "ours", [], OURS_VERSIONS, "ignore_eos", engine=(("cpu_greedy_screen", False),)
    ),
    # the weights where MLX loaded them, on 4 KB pages (engine.cpu_huge_pages off): the baseline of
    # engine/runner/cpu/huge_pages.py
    "ours-4k-pages": Peer(
        "ours-4k-pages", "ours", [], OURS_VERSIONS, "ignore_eos", engine=(("cpu_huge_pages", False),)
    ),
    # the float32 weights read as float32 (engine.cpu_exact_packing off): the baseline of
    # engine/runner/cpu/exact_pack.py
    "ours-unpacked": Peer(
        "ours-unpacked", "ours", [], OURS_VERSIONS, "ignore_eos", engine=(("cpu_exact_packing", False),)
    ),
    # the many-row products through OpenBLAS's sgemm (engine.cpu_onednn off): the baseline of
    # engine/runner/cpu/onednn.py
    "ours-sgemm": Peer(
        "ours-sgemm", "ours", [], OURS_VERSIONS, "ignore_eos", engine=(("cpu_onednn", False),)
    ),
    # K and V stored as 8-bit codes (engine.kv_cache_dtype int8), as llama-server stores them in 16 bits
    # by default: a 16-row decode step at 300 tokens of context reads 221 MB of float32 K/V
    "ours-kv8": Peer(
        "ours-kv8", "ours", [], OURS_VERSIONS, "ignore_eos", engine=(("kv_cache_dtype", "int8"),)
    ),
    # Ray's workers at its default niceness, 15: `serve run` without the README's RAY_worker_niceness=0
    "ours-nice15": Peer(
        "ours-nice15", "ours", [], OURS_VERSIONS, "ignore_eos", env=(("RAY_worker_niceness", "15"),)
    ),
    # Ray Serve's Python HTTP proxy on port 8000, each streamed chunk one more Ray hop: `serve run`
    # without the README's RAY_SERVE_ENABLE_HA_PROXY=1 (HAProxy, and the Ingress serving HTTP itself)
    "ours-python-proxy": Peer(
        "ours-python-proxy",
        "ours",
        [],
        OURS_VERSIONS,
        "ignore_eos",
        env=(("RAY_SERVE_ENABLE_HA_PROXY", "0"),),
    ),
    # Ray Serve's controller loop and metrics export at its defaults (10 a second each): `serve run`
    # without the README's RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.5 and RAY_SERVE_METRICS_EXPORT_INTERVAL_MS=1000
    "ours-ray-defaults": Peer(
        "ours-ray-defaults",
        "ours",
        [],
        OURS_VERSIONS,
        "ignore_eos",
        env=(("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.1"), ("RAY_SERVE_METRICS_EXPORT_INTERVAL_MS", "100")),
    ),
    # every stream carries its own outputs from the Scheduler: no output channels (deployments/inbox.py)
    "ours-no-channels": Peer(
        "ours-no-channels", "ours", [], OURS_VERSIONS, "ignore_eos", app_args=(("output_channels", False),)
    ),
    "mlx-lm": Peer(
        "mlx-lm", "mlx-lm", [MLX_LM, "mlx[cpu]"], ["mlx-lm", "mlx"], "logit_bias", use_model_path=True
    ),
    # vllm-mlx 0.6.0 has no `ignore_eos` (pydantic drops the field silently) but applies logit_bias.
    "vllm-mlx": Peer(
        "vllm-mlx", "vllm-mlx", [VLLM_MLX, "mlx[cpu]"], ["vllm-mlx", "mlx-lm", "mlx"], "logit_bias"
    ),
    "mlx-openai-server": Peer(
        "mlx-openai-server",
        "mlx-openai-server",
        ["mlx[cpu]"],
        ["mlx-openai-server", "mlx-lm", "mlx"],
        "logit_bias",
        no_deps_package=MLX_OPENAI_SERVER,
    ),
    **_llama_peers(),
}


def amx_cpu() -> bool:
    """Whether this CPU has AMX (Sapphire Rapids and later), where llama.cpp built with GGML_NATIVE
    repacks quantized weights for its AMX kernels."""
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


# llama.cpp's AMX kernels crash the server on some AMX machines (SIGSEGV at the first product of the
# repacked Q4_1 weights: ggml-org/llama.cpp#20824, still open; seen here on a 2-core Xeon with AMX).
# There its weights are not repacked: llama-server's --no-repack, and for llama-cpp-python, whose
# Llama class has no such setting, the same field of llama.cpp's model parameters (use_extra_bufts)
# set off before its server starts.
LLAMA_CPP_PYTHON_NO_REPACK = (
    "import runpy, sys\n"
    "import llama_cpp.llama_cpp as api\n"  # the module its Llama class calls the C API through
    "defaults = api.llama_model_default_params\n"
    "def no_repack():\n"
    "    params = defaults()\n"
    "    params.use_extra_bufts = False\n"
    "    return params\n"
    "api.llama_model_default_params = no_repack\n"
    "sys.argv[0] = 'llama_cpp.server'\n"
    "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n"
)


def server_command(peer: Peer, inputs: ServeInputs) -> list[str]:
    bin_dir = peer.venv(inputs.cache) / "bin"
    host_port = ["--host", "127.0.0.1", "--port", str(inputs.port)]
    model_dir = inputs.model_dir
    if peer.kind == "mlx-lm":
        return [str(bin_dir / "python"), "-m", "mlx_lm", "server", "--model", model_dir, *host_port]
    if peer.kind == "vllm-mlx":
        return [str(bin_dir / "vllm-mlx"), "serve", model_dir, "--continuous-batching", "--use-paged-cache",
                *host_port]  # fmt: skip
    if peer.kind == "mlx-openai-server":
        return [str(bin_dir / "mlx-openai-server"), "launch", "--model-path", model_dir, "--model-type", "lm",
                *host_port, "--no-log-file"]  # fmt: skip
    if peer.kind == "llama-server":
        assert inputs.llama_build is not None and peer.weights is not None
        slots = LLAMA_SERVER_SLOTS
        return [str(inputs.llama_build / "bin" / "llama-server"), "-m", str(inputs.ggufs[peer.weights]),
                *host_port, "--parallel", str(slots), "--cont-batching", "-c", str(slots * inputs.ctx_per_slot),
                "-t", str(inputs.num_threads), *(["--no-repack"] if amx_cpu() else [])]  # fmt: skip
    if peer.kind == "llama-cpp-python":
        assert peer.weights is not None
        # It serves one request at a time; by default a new request ends the one streaming (it sends
        # [DONE] early and drops the connection). Off, requests wait their turn.
        start = ["-c", LLAMA_CPP_PYTHON_NO_REPACK] if amx_cpu() else ["-m", "llama_cpp.server"]
        return [str(bin_dir / "python"), *start, "--model", str(inputs.ggufs[peer.weights]),
                *host_port, "--n_threads", str(inputs.num_threads), "--interrupt_requests", "False"]  # fmt: skip
    raise ValueError(f"no command for {peer.name}; ours is started by bench/serve.py")


def eos_body(peer: Peer, eos_token_ids: list[int]) -> dict:
    if peer.eos_mode == "ignore_eos":
        return {"ignore_eos": True}
    return {"logit_bias": {str(i): -100 for i in eos_token_ids}}


def ensure_venv(peer: Peer, cache: Path, reinstall: bool, log) -> Path:
    """Builds the peer's venv once; a venv is reused only if its install finished (marker file).
    Weight variants share one venv: `reinstall` rebuilds it once per run, not once per variant."""
    venv = peer.venv(cache)
    marker = venv / ".bench-installed"
    if marker.exists() and not reinstall:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    log(f"[{peer.name}] creating {venv}")
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    packages = list(peer.packages)
    if peer.no_deps_package:
        wheel = _download_wheel(venv, peer.no_deps_package)
        _run([*pip, "--no-deps", str(wheel)])
        packages += _requirements(wheel)
    log(f"[{peer.name}] pip install {' '.join(packages)}")
    _run([*pip, *packages], peer.install_env)
    marker.write_text(json.dumps(packages))
    return venv


def _download_wheel(venv: Path, requirement: str) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="bench-wheel-"))
    _run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(dest),
            requirement,
        ]
    )
    return next(dest.glob("*.whl"))


def _requirements(wheel: Path) -> list[str]:
    """Requires-Dist of a wheel without extras-only entries and SKIPPED_REQUIREMENTS."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    reqs = [r for r in reqs if "extra ==" not in r]
    return [r for r in reqs if _dist_name(r) not in SKIPPED_REQUIREMENTS]


def _dist_name(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower().replace("_", "-")
    return requirement.lower().replace("_", "-")


def installed_versions(python: str, dists: list[str]) -> dict[str, str | None]:
    code = (
        "import json,sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "def v(d):\n try: return version(d)\n except PackageNotFoundError: return None\n"
        "print(json.dumps({d: v(d) for d in sys.argv[1:]}))"
    )
    out = subprocess.run([python, "-c", code, *dists], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _run(cmd: list[str], extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, **extra_env} if extra_env else None
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({res.returncode}): {res.stderr[-2000:]}")
