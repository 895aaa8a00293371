"""Greedy decode with the C forward's screened head against the full float32 head, in one process.

    env -u OPENBLAS_CORETYPE python bench/greedy_screen.py [--model bundled:smollm2-135m-instruct]
        [--streams 1,2,4] [--tokens 96] [--rounds 3] [--out bench/results/greedy_screen.json]

One engine (the README's defaults, its head read as float32 where exact_pack.py packed it); each round runs every stream count twice, with the screen
(engine/runner/cpu/cpu_greedy.h) and without it (the instance's screen set aside: the full head, as
`engine.cpu_greedy_screen: false` gives), alternating, so a slow moment of the machine slows both. Per
run: ms per decode token per stream (from every stream's first token to the last one's end), and
whether both runs produced the same tokens. Prints a table and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import platform
import statistics
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.runner.cpu.cpu_decode import CpuDecode
from engine.runner.cpu.matrix import Matrix

from bench.gpu import table


def decode(
    llm: LLMEngine, tag: str, streams: int, tokens: int, salt: int = 0
) -> tuple[float, list[list[int]], float]:
    """ms per decode token of one stream, each stream's tokens, and the prefill's ms (until every
    stream has its first token). Each `salt` gives other prompts, new to the prefix cache."""
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=tokens)
    began = time.perf_counter()
    for i in range(streams):
        prompt = [salt % 97 + 2] + [(13 * i + 7 * j) % 5000 + 2 for j in range(180 + 7 * i)]
        llm.add_request(GenerateRequest(f"{tag}-{i}", prompt, params))
    out: dict[str, list[int]] = {}
    start = None
    while llm.has_unfinished_requests():
        for o in llm.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        if start is None and len(out) == streams and all(out.values()):
            start = time.perf_counter()
    assert start is not None
    per_token = (time.perf_counter() - start) / (tokens - 1) * 1e3
    return per_token, [out[f"{tag}-{i}"] for i in range(streams)], (start - began) * 1e3


def with_float32_head(llm: LLMEngine) -> None:
    """The engine's C forward reads its head's float32 weights from now on, as a load without the
    head's exact packing would (direct rows measured again, the screen built): for a head that
    engine/runner/cpu/exact_pack.py packed, which is not screened."""
    decode = llm.runner.decode
    assert isinstance(decode, CpuDecode), "the C forward serves this model"
    weights = list(decode._matrices)
    head = weights[2]
    assert head.exact and head.source is not None, f"this model's head is not packed: {decode.weight_packing}"
    weights[2] = Matrix((head.source,))
    decode.use_float32(weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/greedy_screen.json")
    args = ap.parse_args()
    llm = LLMEngine(EngineConfig(model=args.model))
    kernel = llm.runner.decode
    if isinstance(kernel, CpuDecode) and kernel._matrices[2].exact:
        with_float32_head(llm)  # the bundled model's head is packed (8-bit codes), which is not screened
    screen = getattr(kernel, "screen", None)
    if screen is None:
        raise SystemExit(f"{args.model}: no screened head here (decode path {llm.stats().compute.decode})")
    runs: list[dict] = []
    for r in range(args.rounds):
        for streams in map(int, args.streams.split(",")):
            tokens = {}
            for mode in ("screen", "full head") if r % 2 == 0 else ("full head", "screen"):
                kernel.screen = screen if mode == "screen" else None
                ms, tokens[mode], _ = decode(llm, f"r{r}-{streams}-{mode}", streams, args.tokens)
                runs.append({"round": r, "streams": streams, "mode": mode, "ms_per_token": ms})
            kernel.screen = screen
            runs[-1]["same_tokens"] = runs[-2]["same_tokens"] = tokens["screen"] == tokens["full head"]
    rows = []
    for streams in map(int, args.streams.split(",")):
        cell = {m: [x["ms_per_token"] for x in runs if x["streams"] == streams and x["mode"] == m]
                for m in ("screen", "full head")}  # fmt: skip
        same = all(x["same_tokens"] for x in runs if x["streams"] == streams)
        med = {m: statistics.median(v) for m, v in cell.items()}
        rows.append([streams, " / ".join(f"{v:.2f}" for v in cell["screen"]),
                     " / ".join(f"{v:.2f}" for v in cell["full head"]),
                     f"{med['full head'] / med['screen']:.2f}x", same])  # fmt: skip
    machine = f"{platform.processor() or platform.machine()}, {platform.system()}"
    print(f"\n{args.model} on {machine}: ms per decode token per stream, rounds in order\n")
    table(["streams", "screened head", "full head", "full / screened (medians)", "same tokens"], rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "machine": machine, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
