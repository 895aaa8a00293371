"""Stress run: continuous batching through one `LLMEngine` (no Ray, no HTTP) for thousands of requests.

    python bench/stress.py [--shape 1b|tiny] [--model DIR] [--steps 20000] [--seed 0] [--max-concurrency 100]
                           [--out bench/results/stress.json] [--config key=value ...] [--max-seconds S]
                           [--max-prompt 1500] [--window 1000] [--band LO,HI] [--sync]
    python bench/stress.py --shape tiny --steps 400 --max-concurrency 16 --max-prompt 400   # CPU smoke run

Workload: a target concurrency redrawn uniformly in [1, max_concurrency] every 200 steps and topped up
whenever fewer requests are live; prompts of random token ids, log-uniform in [16, 1500] tokens;
`max_tokens` uniform in [1, 200] with `ignore_eos`; one request in five sampled (temperature 0.8,
top_p 0.95, seeded), the rest greedy; one in 20 asks for 5 logprobs; one in 50 is aborted mid-flight.
After `--steps` engine steps no request is added and the live ones drain.

Checks (exit 1, saying why): every request ends exactly once; non-aborted ones with max_tokens tokens and
finish_reason "length"; aborted ones "abort"; no "error"; logprobs on every token of those that asked;
no exception; after the drain nothing runs, waits or holds a KV block.

Each step's wall time and composition (decode rows, prefill chunks and their tokens) are read by
wrapping the engine instance's `scheduler.schedule` and `runner.execute` (engine code is unchanged), as
are its phases: schedule, execute (builds and launches the step's graph), sample (host sampling,
waiting for the logits), read (the previous async step's tokens: waiting for the device), sync
(`--sync` only: `mx.synchronize()` after every step, so each step's device time lands in its own row
instead of the next one's; it removes the host/device overlap) and rest. Tables: bench/stress_report.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX on CPU-only machines)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import RequestOutput

import mlx.core as mx
import numpy as np
from pydantic import ValidationError

from bench.gpu_models import build_model_dir, parse_overrides, parse_shapes
from bench.stress_load import MAX_OUTPUT_LEN, MIN_PROMPT_LEN, Tracked, Workload, request_failures
from bench.stress_report import (
    PHASES,
    StepLog,
    composition,
    machine,
    memory_mark,
    print_composition,
    print_totals,
    print_windows,
    slowdown,
    windows,
)

SHAPES = ("1b", "tiny")  # Llama-3.2-1B's config; the same structure at a size a CPU runs in seconds
REDRAW_STEPS = 200
PROCESS_START = time.perf_counter()  # what --max-seconds counts from
MAX_IDLE_CALLS = 1000  # step() calls in a row with nothing scheduled: the engine is stuck


class StepProbe:
    """Times one `engine.step()` and its phases and captures its plan, by wrapping methods on the
    engine's instances; a method missing from this engine version is simply not timed."""

    def __init__(self, llm: LLMEngine, sync: bool):
        self.llm, self.sync = llm, sync
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.plan = None
        self.untimed: list[str] = []  # methods this engine version lacks: their time falls in "rest"
        self._wrap(llm.scheduler, "schedule", "schedule", keep_result=True)
        self._wrap(llm.runner, "execute", "execute")
        self._wrap(llm, "_sample_on_host", "sample")
        self._wrap(llm, "_read_in_flight", "read")

    def _wrap(self, owner: object, name: str, phase: str, keep_result: bool = False) -> None:
        inner = getattr(owner, name, None)
        if inner is None:
            self.untimed.append(f"{type(owner).__name__}.{name}")
            return

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                result = inner(*args, **kwargs)
            finally:
                self.phase_s[phase] += time.perf_counter() - t0
            if keep_result:
                self.plan = result
            return result

        setattr(owner, name, timed)

    def step(self) -> tuple[list[RequestOutput], float]:
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.plan = None
        t0 = time.perf_counter()
        outputs = self.llm.step()
        if self.sync:
            t1 = time.perf_counter()
            mx.synchronize()
            self.phase_s["sync"] = time.perf_counter() - t1
        return outputs, time.perf_counter() - t0


class StressRun:
    """The loop: top up, send due aborts, step, account for every output."""

    def __init__(self, llm: LLMEngine, workload: Workload, probe: StepProbe, args: argparse.Namespace):
        self.llm, self.workload, self.probe, self.args = llm, workload, probe, args
        self.live: dict[str, Tracked] = {}
        self.done: dict[str, Tracked] = {}
        self.to_abort: dict[str, Tracked] = {}
        self.problems: list[str] = []  # outputs the bench did not expect, as they came
        self.log = StepLog(window=args.window)
        self.num_idle_calls = 0
        self.drawn_for = -1  # the REDRAW_STEPS period whose target is drawn
        self.stopped_by_time = False
        self.num_steps_at_drain: int | None = None  # steps run when adding stopped
        self.t0 = time.perf_counter()

    def run(self) -> None:
        idle_in_row = 0
        while True:
            adding = self._still_adding()
            if adding:
                self._top_up()
            self._send_aborts()
            if not adding and not self.llm.has_unfinished_requests():
                if len(self.log) % self.log.window:  # the last, partial window's mark
                    self.mark()
                return
            outputs, step_s = self.probe.step()
            ran = self.probe.plan is not None and not self.probe.plan.is_empty
            idle_in_row = 0 if ran else idle_in_row + 1
            if idle_in_row > MAX_IDLE_CALLS:
                raise RuntimeError(
                    f"{MAX_IDLE_CALLS} step() calls in a row scheduled nothing: the engine is stuck"
                )
            finished = self._consume(outputs)
            if ran:
                self._record(step_s, outputs, finished)
            else:
                self.num_idle_calls += 1

    def _still_adding(self) -> bool:
        if self.num_steps_at_drain is not None:
            return False
        over_time = (
            self.args.max_seconds is not None and time.perf_counter() - PROCESS_START > self.args.max_seconds
        )
        if len(self.log) < self.args.steps and not over_time:
            return True
        self.num_steps_at_drain, self.stopped_by_time = len(self.log), over_time
        why = f"--max-seconds {self.args.max_seconds} reached" if over_time else "--steps reached"
        print(f"{why} at step {len(self.log):,}: draining", flush=True)
        return False

    def _top_up(self) -> None:
        if len(self.log) // REDRAW_STEPS != self.drawn_for:
            self.drawn_for = len(self.log) // REDRAW_STEPS
            self.workload.redraw()
        while len(self.live) < self.workload.target:
            request, tracked = self.workload.request()
            self.llm.add_request(request)
            self.live[request.request_id] = tracked
            if tracked.abort_after is not None:
                self.to_abort[request.request_id] = tracked

    def _send_aborts(self) -> None:
        due = [rid for rid, t in self.to_abort.items() if t.num_tokens >= (t.abort_after or 0)]
        for rid in due:
            tracked = self.to_abort.pop(rid)
            if tracked.finish_reason is None:
                self.llm.abort_request(rid)
                tracked.abort_sent = True

    def _consume(self, outputs: list[RequestOutput]) -> int:
        finished = 0
        for out in outputs:
            tracked = self.live.get(out.request_id)
            if tracked is None:
                self.problems.append(f"output for a request not live: {out.request_id}")
                continue
            tracked.num_tokens += len(out.new_token_ids)
            tracked.num_logprobs += len(out.logprobs or [])
            tracked.num_bad_logprobs += sum(len(lp.top) != 5 for lp in out.logprobs or [])
            tracked.error = tracked.error or out.error
            if out.finished:
                tracked.finish_reason = out.finish_reason
                self.done[out.request_id] = self.live.pop(out.request_id)
                self.to_abort.pop(out.request_id, None)
                finished += 1
        return finished

    def _record(self, step_s: float, outputs: list[RequestOutput], finished: int) -> None:
        log, plan = self.log, self.probe.plan
        assert plan is not None
        log.step_ms.append(1e3 * step_s)
        for phase, seconds in self.probe.phase_s.items():
            log.phase_ms[phase].append(1e3 * seconds)
        # As the runner splits a plan: one new token is a decode row, more is a prefill chunk.
        log.num_decode.append(sum(s.num_new_tokens == 1 for s in plan.scheduled))
        log.chunk_lens.append([s.num_new_tokens for s in plan.scheduled if s.num_new_tokens > 1])
        log.num_tokens_out.append(sum(len(o.new_token_ids) for o in outputs))
        log.num_finished.append(finished)
        log.end_s.append(time.perf_counter() - self.t0)
        if len(log) % log.window == 0:
            self.mark()
            self._progress()

    def mark(self) -> None:
        """Memory and KV blocks held at a window's end (and once more after the drain)."""
        self.log.marks.append({**memory_mark(), "kv_blocks_used": self.llm.pool.num_used})

    def _progress(self) -> None:
        w = slice(-self.log.window, None)
        decode = [ms for ms, c in zip(self.log.step_ms[w], self.log.chunk_lens[w]) if not c]
        wall_s = self.log.end_s[-1] - (
            self.log.end_s[-self.log.window - 1] if len(self.log) > self.log.window else 0
        )
        print(
            f"step {len(self.log):,}/{self.args.steps:,}  {self.log.end_s[-1]:,.0f} s  live {len(self.live)}  "
            f"finished {len(self.done):,}  decode-only median "
            f"{np.median(decode) if decode else float('nan'):.2f} ms  "
            f"{sum(self.log.num_tokens_out[w]) / wall_s:,.0f} tok/s",
            flush=True,
        )


# ---- checks -------------------------------------------------------------------------------------


def check(run: StressRun, llm: LLMEngine) -> list[str]:
    """Every failure, one line per kind: a count and the first example."""
    found: Counter[str] = Counter()
    example: dict[str, str] = {}

    def fail(kind: str, detail: str) -> None:
        found[kind] += 1
        example.setdefault(kind, detail)

    for problem in run.problems:
        fail("unexpected output", problem)
    for rid in run.live:
        fail("never finished", rid)
    for rid, t in run.done.items():
        for kind in request_failures(t):
            fail(kind, f"{rid}: {t}")
    stats = llm.stats()
    if stats.num_running or stats.num_waiting or stats.num_blocks_used:
        fail(
            "engine not idle after drain",
            f"{stats.num_running=} {stats.num_waiting=} {stats.num_blocks_used=}",
        )
    return [f"{kind}: {n} request(s), e.g. {example[kind]}" for kind, n in found.items()]


# ---- setup and report ---------------------------------------------------------------------------


def build_random_model(path: Path, shape: str, seed: int) -> None:
    """bench/gpu.py's random-weight Llama-3.2-1B-shaped directory (or its tiny variant)."""
    (spec,) = parse_shapes("1b", tiny=shape == "tiny")
    build_model_dir(path, spec, seed)


def engine_config(model: str, args: argparse.Namespace) -> EngineConfig:
    fields: dict = {"max_num_seqs": args.max_concurrency, "max_num_batched_tokens": 2048}
    if args.model is None:  # the random model: room for every live request's prompt and output
        fields["kv_cache_memory_bytes"] = (8 << 30) if args.shape == "1b" else (1 << 30)
    fields.update(parse_overrides(args.config, "--config"))
    try:
        return EngineConfig(model=model, **fields)
    except ValidationError as exc:
        raise SystemExit(f"--config: {exc}") from None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="1b", help="random model when no --model")
    parser.add_argument("--model", help="an mlx-lm model directory instead of a random one")
    parser.add_argument("--steps", type=int, default=20000, help="engine steps before the drain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-concurrency", type=int, default=100)
    parser.add_argument("--max-prompt", type=int, default=1500, help="longest prompt, in tokens")
    parser.add_argument(
        "--max-seconds",
        type=float,
        help="stop adding requests this long after the process started (model build and load included), "
        "then drain: a run under an outer time limit still writes its report",
    )
    parser.add_argument(
        "--window", type=int, default=1000, help="steps per row of table (a) and progress line"
    )
    parser.add_argument("--band", help="decode rows LO,HI for the slowdown ratio; default 0.32x-0.64x max")
    parser.add_argument("--sync", action="store_true", help="mx.synchronize() after every step (see above)")
    parser.add_argument("--config", action="append", default=[], help="EngineConfig key=value (JSON value)")
    parser.add_argument("--out", default="bench/results/stress.json")
    return parser.parse_args()


def band_of(args: argparse.Namespace) -> tuple[int, int]:
    if args.band:
        lo, hi = (int(x) for x in args.band.split(","))
        return lo, hi
    lo = max(1, round(0.32 * args.max_concurrency))
    return lo, max(lo, round(0.64 * args.max_concurrency))


def report(run: StressRun, llm: LLMEngine, args: argparse.Namespace) -> dict:
    band = band_of(args)
    rows = windows(run.log, band)
    slow = slowdown(rows, band)
    comp = composition(run.log)
    stats = llm.stats()
    wall_s = run.log.end_s[-1] if len(run.log) else 0.0  # the last step's end: the run without the checks
    totals = {
        "requests": run.workload.num_made,
        "finished length": sum(t.finish_reason == "length" for t in run.done.values()),
        "aborted": sum(t.finish_reason == "abort" for t in run.done.values()),
        "errors": sum(t.finish_reason == "error" for t in run.done.values()),
        "prompt tokens": stats.prompt_tokens_total,
        "output tokens": stats.generation_tokens_total,
        "engine steps": len(run.log),
        "steps asked": args.steps,
        "steps before the drain": run.num_steps_at_drain,
        "stopped by --max-seconds": run.stopped_by_time,
        "idle step() calls": run.num_idle_calls,
        "preemptions": stats.num_preemptions,
        "wall s": wall_s,
        "steps/s": len(run.log) / wall_s if wall_s else None,
        "output tok/s": stats.generation_tokens_total / wall_s if wall_s else None,
    }
    print_windows(rows, run.log.window, band, slow)
    print_composition(comp)
    print_totals(totals)
    return {"windows": rows, "slowdown": slow, "composition": comp, "totals": totals}


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = engine_config(
            args.model or tmp, args
        )  # before the model is built: a bad --config fails fast
        if args.model is None:
            build_random_model(Path(tmp), args.shape, args.seed)
        llm = LLMEngine(config)
        max_prompt_len = max(MIN_PROMPT_LEN + 1, min(args.max_prompt, llm.max_model_len - MAX_OUTPUT_LEN - 1))
        workload = Workload(args.seed, llm.vocab_size, max_prompt_len, args.max_concurrency)
        probe = StepProbe(llm, args.sync)
        run = StressRun(llm, workload, probe, args)
        results: dict = {"machine": machine(), "args": vars(args), "config": config.model_dump()}
        results.update(compute=asdict(llm.compute), untimed=probe.untimed)
        print(f"{results['machine']['mlx_device']} {results['machine']['device_info']}, MLX {mx.__version__}")
        print(
            f"compute: {llm.compute}\nnot timed (absent): {probe.untimed or 'none'}\nmax prompt {max_prompt_len} tokens, {args.steps:,} steps",
            flush=True,
        )
        failures = []
        try:
            run.run()
        except Exception:  # noqa: BLE001  (reported as the run's failure, with the tables so far)
            failures.append(f"exception: {traceback.format_exc()}")
        failures += check(run, llm)
        results.update(report(run, llm, args), failures=failures)
    out = Path(args.out)
    steps_out = out.with_name(f"{out.stem}_steps.json")  # every step, columnar: ~1 MB per 20,000 steps
    results["steps_file"] = steps_out.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    steps_out.write_text(json.dumps(run.log.to_json()))
    print(f"\nwrote {out} and {steps_out}")
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
