"""Two engines of one model that differ in one setting, alternating in one process (a slow moment of
the machine slows both): per stream count, ms per decode token of one stream, the prefill's ms, and
whether both produced the same tokens; and a closed loop of clients, bench/serve.py's workload without
the serving (each client's next request, a new ~200-token prompt, starts when its last one ends). Used
by bench/huge_pages.py, bench/exact_pack.py and bench/packed_head.py."""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from pathlib import Path

from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

from bench.gpu import table
from bench.greedy_screen import decode


def arguments(description: str, out: str, extra: dict[str, str] | None = None) -> argparse.Namespace:
    """The benchmarks' shared command line, and `extra` options (name: default, strings) of one."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--closed-loop", type=int, default=0, help="also N clients in a closed loop (0: not)")
    for name, default in (extra or {}).items():
        ap.add_argument(name, default=default)
    ap.add_argument("--out", default=out)
    return ap.parse_args()


def alternate(engines: dict[str, LLMEngine], streams: list[int], tokens: int, rounds: int) -> list[dict]:
    """Each round runs every stream count on both engines, the order of the two alternating by round;
    each round's prompts are new to the prefix cache."""
    modes = list(engines)
    runs: list[dict] = []
    for r in range(rounds):
        for n in streams:
            out = {}
            for mode in modes if r % 2 == 0 else modes[::-1]:
                ms, out[mode], prefill = decode(engines[mode], f"r{r}-{n}-{mode}", n, tokens, r)
                runs.append(
                    {"round": r, "streams": n, "mode": mode, "prefill_ms": prefill, "ms_per_token": ms}
                )
            runs[-1]["same_tokens"] = runs[-2]["same_tokens"] = out[modes[0]] == out[modes[1]]
    return runs


def rows(runs: list[dict], modes: list[str], streams: list[int]) -> list[list]:
    """Table rows: per stream count and measure, each run of both modes in order, the ratio of the
    medians (the second mode over the first: above 1 when the first is faster), same tokens."""
    out = []
    for n in streams:
        cell = {m: [x for x in runs if x["streams"] == n and x["mode"] == m] for m in modes}
        same = all(x["same_tokens"] for x in runs if x["streams"] == n)
        for key, unit in (("ms_per_token", "decode ms/token"), ("prefill_ms", "prefill ms")):
            med = {m: statistics.median(x[key] for x in v) for m, v in cell.items()}
            runs_text = [" / ".join(f"{x[key]:.1f}" for x in cell[m]) for m in modes]
            out.append([n, unit, *runs_text, f"{med[modes[1]] / med[modes[0]]:.2f}x", same])
    return out


def closed_loop(engines: dict[str, LLMEngine], clients: int, requests: int, rounds: int) -> list[dict]:
    """Output tok/s of `requests` requests (128 greedy tokens each, EOS ignored) through `clients`
    clients per engine and round, the engines' order alternating by round."""
    modes, salt, runs = list(engines), itertools.count(), []
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            tok_s = _closed_run(engines[mode], clients, requests, salt)
            runs.append({"round": r, "mode": mode, "clients": clients, "tok_s": tok_s})
    return runs


def _closed_run(llm: LLMEngine, clients: int, requests: int, salt: itertools.count) -> float:
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    submitted, finished, tokens = 0, 0, 0

    def submit() -> None:
        nonlocal submitted
        n = next(salt)  # a prompt new to the prefix cache
        prompt = [n % 97 + 2] + [(31 * n + 7 * j) % 5000 + 2 for j in range(200)]
        llm.add_request(GenerateRequest(f"closed-{n}", prompt, params))
        submitted += 1

    for _ in range(clients):
        submit()
    began = time.perf_counter()
    while finished < requests:
        for out in llm.step():
            tokens += len(out.new_token_ids)
            if out.finished:
                finished += 1
                if submitted < requests:
                    submit()
    elapsed = time.perf_counter() - began
    while llm.has_unfinished_requests():  # the last clients' requests past the count
        llm.step()
    return tokens / elapsed


def closed_rows(runs: list[dict], modes: list[str]) -> list[list]:
    """One table row of closed_loop's runs: each mode's tok/s by round, and the ratio of the medians
    (the first mode over the second)."""
    cells = [" / ".join(f"{x['tok_s']:.1f}" for x in runs if x["mode"] == m) for m in modes]
    med = [statistics.median(x["tok_s"] for x in runs if x["mode"] == m) for m in modes]
    return [[*cells, f"{med[0] / med[1]:.2f}x"]]


def closed_loop_report(engines: dict[str, LLMEngine], args: argparse.Namespace, ratio: str) -> list[dict]:
    """closed_loop with `--closed-loop` clients (three requests each per engine and round) and its table
    printed, the column of the medians' ratio titled `ratio`; [] without `--closed-loop`."""
    if not args.closed_loop:
        return []
    runs = closed_loop(engines, args.closed_loop, 3 * args.closed_loop, args.rounds)
    print(f"\n{args.closed_loop} clients in a closed loop, output tok/s by round\n")
    table([*engines, ratio], closed_rows(runs, list(engines)))
    return runs


def compare(
    engines: dict[str, LLMEngine], args: argparse.Namespace, note: str, ratios: tuple[str, str], extra: dict
) -> None:
    """The two engines alternating (per stream count, then `--closed-loop`): prints the tables under
    the model, the machine and `note`, titling the medians' ratios `ratios` (streams, closed loop), and
    writes `--out` with `extra`."""
    modes, streams = list(engines), [int(n) for n in args.streams.split(",")]
    runs = alternate(engines, streams, args.tokens, args.rounds)
    machine = f"{platform.processor() or platform.machine()}, {platform.system()}"
    print(f"\n{args.model} on {machine}; {note}\n")
    table(["streams", "measure", *modes, ratios[0], "same tokens"], rows(runs, modes, streams))
    closed = closed_loop_report(engines, args, ratios[1])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "machine": machine, **extra, "runs": runs, "closed_loop": closed}
    Path(args.out).write_text(json.dumps(result, indent=1))
