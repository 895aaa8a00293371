"""Where a single stream's decode token goes: the engine's step split into its parts, in-process, and the
same stream over HTTP through `serve run`, whose extra time per token is what the Ray hops, the SSE
encoding and the HTTP proxy add.

    OPENBLAS_NUM_THREADS=2 python bench/step_breakdown.py [--models bundled:smollm2-135m-instruct,...-q4]
        [--http] [--config serve_config.yaml] [--out bench/results/step_breakdown.json]

Give this process the BLAS threads the config's Scheduler gets (`scheduler.num_threads`, 2 shipped), so
that the in-process step and the served one compare like for like.

In-process: one ~200-token prompt, `--max-tokens` greedy tokens with EOS ignored, `--rounds` times after a
warm-up; each decode step's wall time and, inside it, the time of each part (timers wrapped around the
engine's own methods): scheduling, the model forward (for the C forward: the whole forward, synchronous),
sampling (with it the wait for a lazy forward on MLX's path), stop checks + detokenizing + output, and the
rest of `LLMEngine.step`. Medians of the per-step times, in ms per token.
`--http`: the same prompt length and tokens per request over HTTP, one client, `--http-requests`
requests; per-token time = (last content delta - first) / (tokens - 1), the median over requests.
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
import statistics
import tempfile
import time
import uuid

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

import yaml

from bench import serve_load, serve_proc, serve_report
from bench.engine import prompts
from bench.part_timer import PartTimer

PARTS = ("schedule", "forward", "sample", "output")


def engine_breakdown(model: str, max_tokens: int, rounds: int) -> dict:
    llm = LLMEngine(EngineConfig(model=model))
    timer = PartTimer(PARTS)
    timer.wrap(llm.scheduler, "schedule", "schedule")
    timer.wrap(llm.runner, "execute", "forward")
    timer.wrap(llm.sampler, "on_host", "sample")
    timer.wrap(llm.outputs, "process", "output")
    ids = prompts(llm, 1, 200)[0]
    steps: list[dict[str, float]] = []
    for round_ in range(rounds + 1):  # round 0 warms up
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        llm.add_request(GenerateRequest(f"b{round_}-{uuid.uuid4().hex[:6]}", ids, params))
        first = True
        while llm.has_unfinished_requests():
            timer.reset()
            start = time.perf_counter()
            llm.step()
            total = time.perf_counter() - start
            if not first and round_ > 0:  # decode steps only
                steps.append({"total": total, **timer.spent})
            first = False
    medians = {key: statistics.median(s[key] for s in steps) * 1000 for key in ("total", *PARTS)}
    medians["rest of step"] = max(0.0, medians["total"] - sum(medians[p] for p in PARTS))
    return {
        "model": model,
        "compute_paths": llm.stats().compute.__dict__,
        "decode_steps": len(steps),
        "prompt_tokens": len(ids),
        "ms_per_token": medians,
    }


def http_per_token_ms(model: str, config_path: Path, max_tokens: int, requests: int, log) -> dict:
    """Starts `serve run` on a copy of the config with `model` as the engine's model; one client."""
    config = yaml.safe_load(config_path.read_text())
    config["applications"][0]["args"]["engine"]["model"] = model
    port = int((config.get("http_options") or {}).get("port", 8000))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config))
        env = serve_proc.ours_env(dict(os.environ))
        cmd = [str(Path(sys.executable).parent / "serve"), "run", str(path)]
        log_path = Path(tmp) / "serve.log"
        server = serve_proc.start("ours", cmd, env, REPO, log_path, port, signal.SIGINT)
        try:
            model_ids = serve_proc.wait_ready(server, 300)
            nonce = uuid.uuid4().hex[:8]
            body = [
                serve_load.request_body(
                    model_ids[0], serve_load.make_messages(i, nonce, 120), max_tokens, {"ignore_eos": True}
                )
                for i in range(requests + 1)
            ]
            asyncio.run(serve_load.run_level(server.base_url, body[:1], 1, 180))  # warm-up
            level = asyncio.run(serve_load.run_level(server.base_url, body[1:], 1, 180))
        finally:
            serve_proc.stop(server)
    itls = sorted(r.itl_s for r in level.requests if r.itl_s is not None)
    if not itls:
        raise RuntimeError(f"no request streamed tokens: {level.summary()['error_samples']}")
    log(f"[{model}] over HTTP: {statistics.median(itls) * 1000:.1f} ms per token")
    return {"per_token_ms_p50": statistics.median(itls) * 1000, "requests": len(itls)}


def table(results: list[dict]) -> str:
    names = [r["model"].removeprefix("bundled:") for r in results]
    lines = ["| part | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for part in ("schedule", "forward", "sample", "output", "rest of step", "total"):
        cells = [f"{r['ms_per_token'][part]:.2f}" for r in results]
        label = "**engine step**" if part == "total" else part
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if all("http" in r for r in results):
        hops = [r["http"]["per_token_ms_p50"] - r["ms_per_token"]["total"] for r in results]
        lines.append(
            "| Ray hops, SSE, HTTP (= over HTTP - engine step) | "
            + " | ".join(f"{h:.2f}" for h in hops)
            + " |"
        )
        cells = [f"{r['http']['per_token_ms_p50']:.2f}" for r in results]
        lines.append("| **over HTTP, per token (p50)** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bundled:smollm2-135m-instruct,bundled:smollm2-135m-instruct-q4")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--http", action="store_true", help="also time the same stream through `serve run`")
    ap.add_argument("--http-requests", type=int, default=4)
    ap.add_argument("--config", default="serve_config.yaml")
    ap.add_argument("--out", default="bench/results/step_breakdown.json")
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    results = []
    for model in args.models.split(","):
        result = engine_breakdown(model, args.max_tokens, args.rounds)
        log(f"[{model}] engine step {result['ms_per_token']['total']:.1f} ms per token")
        if args.http:
            result["http"] = http_per_token_ms(
                model, REPO / args.config, args.max_tokens, args.http_requests, log
            )
        results.append(result)
    print(table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": serve_report.machine(), "settings": vars(args), "results": results}
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
