"""Everything `bench/serve.py` needs before its first server starts: the peers' venvs, the llama.cpp
build and the f32 GGUF, so installs and builds never overlap a measurement.

Owns nothing on disk itself (bench/serve_peers.py owns the venvs, bench/serve_llama.py the build);
it records in `env_info` where the build and the GGUFs are, and never starts a server.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench import serve_llama, serve_peers


def install_peers(names: list[str], env_info: dict, args, log: Callable[[str], None]) -> dict[str, str]:
    """Returns name -> why, for each server whose install or build failed (it will not run)."""
    failed = {}
    cache = Path(env_info["cache_dir"])
    venvs_done: set[Path] = set()  # weight variants share a venv: install (or --reinstall) it once
    for name in names:
        peer = serve_peers.PEERS[name]
        try:
            if peer.kind in serve_peers.LLAMA_KINDS:
                prepare_llama(peer, env_info, args, log)
            if peer.packages and peer.venv(cache) not in venvs_done:
                serve_peers.ensure_venv(peer, cache, args.reinstall, log)
                venvs_done.add(peer.venv(cache))
        except (RuntimeError, OSError, StopIteration) as exc:
            failed[name] = f"install failed: {exc}"
            log(f"[{name}] {failed[name]}")
    return failed


def prepare_llama(peer: serve_peers.Peer, env_info: dict, args, log: Callable[[str], None]) -> None:
    """llama-server needs the build; an f32 peer needs the f32 GGUF, which the build's llama-quantize makes."""
    cache = Path(env_info["cache_dir"])
    ggufs = env_info.setdefault("ggufs", {"q4_1": env_info["gguf_path"]})
    if serve_llama.f32_gguf_path(cache).exists():
        ggufs["f32"] = str(serve_llama.f32_gguf_path(cache))
    if peer.kind != "llama-server" and peer.weights in ggufs:
        return
    if env_info.get("llama_build_error"):
        raise RuntimeError(env_info["llama_build_error"])
    if not env_info.get("llama_build"):
        given = Path(args.llama_build).resolve() if args.llama_build else None
        try:
            env_info["llama_build"] = serve_llama.ensure_build(cache, given, log)
        except (RuntimeError, OSError) as exc:
            env_info["llama_build_error"] = f"llama.cpp build: {exc}"
            raise
    if peer.weights == "f32" and "f32" not in ggufs:
        build = Path(env_info["llama_build"]["dir"])
        ggufs["f32"] = str(serve_llama.ensure_f32_gguf(cache, build, Path(env_info["gguf_path"]), log))
