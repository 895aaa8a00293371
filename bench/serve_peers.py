"""The servers `bench/serve.py` compares: how each is installed, started and asked to ignore EOS.

Owns the per-peer virtualenvs under `<cache>/bench-venvs/<peer>` (built once, reused after) and the
exact command line of every server; it never starts a process that serves (bench/serve_proc.py does).

Every peer runs MLX's Linux CPU backend (`mlx[cpu]`), pinned to the version tested here so reruns
compare the same code; `--reinstall` rebuilds a venv.
"""

from __future__ import annotations

import json
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
# mflux (image generation) has no Linux build; mlx-openai-server imports it only for image models.
SKIPPED_REQUIREMENTS = {"mflux"}


@dataclass(frozen=True)
class Peer:
    name: str
    packages: list[str]  # what `pip install` gets; [] for our own server
    version_of: list[str]  # distributions whose versions go into the JSON
    # Extra body fields that stop the server from ending at EOS ("ignore_eos" where it is accepted,
    # else a -100 logit bias on the EOS ids, filled in by `eos_body`).
    eos_mode: str
    no_deps_package: str | None = None  # installed --no-deps, its requirements minus SKIPPED_REQUIREMENTS
    use_model_path: bool = False  # send the model directory as `model` (mlx-lm loads any other name)
    extra_env: dict[str, str] = field(default_factory=dict)

    def venv(self, cache: Path) -> Path:
        return cache / "bench-venvs" / self.name


PEERS: dict[str, Peer] = {
    "ours": Peer("ours", [], ["mlx-ray-serve", "mlx", "mlx-lm", "ray"], "ignore_eos"),
    "mlx-lm": Peer("mlx-lm", [MLX_LM, "mlx[cpu]"], ["mlx-lm", "mlx"], "logit_bias", use_model_path=True),
    # vllm-mlx 0.6.0 has no `ignore_eos` (pydantic drops the field silently) but applies logit_bias.
    "vllm-mlx": Peer("vllm-mlx", [VLLM_MLX, "mlx[cpu]"], ["vllm-mlx", "mlx-lm", "mlx"], "logit_bias"),
    "mlx-openai-server": Peer(
        "mlx-openai-server",
        ["mlx[cpu]"],
        ["mlx-openai-server", "mlx-lm", "mlx"],
        "logit_bias",
        no_deps_package=MLX_OPENAI_SERVER,
    ),
}


def server_command(peer: Peer, cache: Path, model_dir: str, port: int) -> list[str]:
    bin_dir = peer.venv(cache) / "bin"
    if peer.name == "mlx-lm":
        return [str(bin_dir / "python"), "-m", "mlx_lm", "server", "--model", model_dir,
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if peer.name == "vllm-mlx":
        return [str(bin_dir / "vllm-mlx"), "serve", model_dir, "--continuous-batching", "--use-paged-cache",
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if peer.name == "mlx-openai-server":
        return [str(bin_dir / "mlx-openai-server"), "launch", "--model-path", model_dir, "--model-type", "lm",
                "--host", "127.0.0.1", "--port", str(port), "--no-log-file"]  # fmt: skip
    raise ValueError(f"no command for {peer.name}; ours is started by bench/serve_proc.py")


def eos_body(peer: Peer, eos_token_ids: list[int]) -> dict:
    if peer.eos_mode == "ignore_eos":
        return {"ignore_eos": True}
    return {"logit_bias": {str(i): -100 for i in eos_token_ids}}


def ensure_venv(peer: Peer, cache: Path, reinstall: bool, log) -> Path:
    """Builds the peer's venv once; a venv is reused only if its install finished (marker file)."""
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
    _run([*pip, *packages])
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


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({res.returncode}): {res.stderr[-2000:]}")
