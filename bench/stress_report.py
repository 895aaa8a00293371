"""The stress run's step log and its tables (bench/stress.py): over time, by step composition, totals;
and the machine it ran on. Owns the per-step records and the arithmetic over them; never steps the engine.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import mlx.core as mx
import numpy as np

# Phases timed inside a step (bench/stress.py's StepProbe); "rest" is the step's time outside them.
PHASES = ("schedule", "execute", "sample", "read", "sync")
ENV_VARS = ("MLX_CUDA_GRAPH_CACHE_SIZE", "MLX_ENABLE_CACHE_THRASHING_CHECK", "MLX_MAX_OPS_PER_BUFFER")
PREFILL_BUCKETS = ((1, 255, "prefill < 256 tok"), (256, 1023, "prefill 256-1023"))
PREFILL_BUCKETS += ((1024, 2047, "prefill 1024-2047"), (2048, 1 << 40, "prefill >= 2048"))
DECODE_BUCKETS = ((1, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 40))


@dataclass
class StepLog:
    """One entry per engine step that ran a plan, columnar (times in ms), read in windows of `window` steps."""

    window: int = 1000
    step_ms: list[float] = field(default_factory=list)
    phase_ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    num_decode: list[int] = field(default_factory=list)  # rows of one new token
    chunk_lens: list[list[int]] = field(default_factory=list)  # prefill chunks' token counts
    num_tokens_out: list[int] = field(default_factory=list)  # tokens the step's outputs carried
    num_finished: list[int] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)  # since the run started
    marks: list[dict] = field(default_factory=list)  # memory and KV blocks at each window's end

    def __len__(self) -> int:
        return len(self.step_ms)

    def arrays(self) -> dict[str, np.ndarray]:
        a = {
            "step_ms": np.array(self.step_ms),
            "num_decode": np.array(self.num_decode),
            "num_chunks": np.array([len(c) for c in self.chunk_lens]),
            "prefill_tokens": np.array([sum(c) for c in self.chunk_lens]),
            "num_tokens_out": np.array(self.num_tokens_out),
            "num_finished": np.array(self.num_finished),
            "end_s": np.array(self.end_s),
        }
        a.update({f"{p}_ms": np.array(v) for p, v in self.phase_ms.items()})
        return a

    def to_json(self) -> dict:
        cols = {k: [round(float(x), 3) for x in v] for k, v in self.arrays().items()}
        return {**cols, "chunk_lens": self.chunk_lens, "marks": self.marks}


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


# ---- (a) over time ------------------------------------------------------------------------------


def windows(log: StepLog, band: tuple[int, int]) -> list[dict]:
    arrays = log.arrays()
    rows = []
    for start in range(0, len(log), log.window):
        sl = slice(start, start + log.window)
        w = {k: v[sl] for k, v in arrays.items()}
        decode = w["step_ms"][w["num_chunks"] == 0]
        in_band = (w["num_chunks"] == 0) & (w["num_decode"] >= band[0]) & (w["num_decode"] <= band[1])
        wall_s = w["end_s"][-1] - (arrays["end_s"][start - 1] if start else 0.0)
        mark = log.marks[start // log.window] if start // log.window < len(log.marks) else {}
        rows.append(
            {
                "first_step": start + 1,
                "steps": len(w["step_ms"]),
                "decode_only_steps": len(decode),
                "decode_only_median_ms": _pct(decode, 50),
                "decode_only_p90_ms": _pct(decode, 90),
                "band_steps": int(in_band.sum()),
                "band_median_ms": _pct(w["step_ms"][in_band], 50),
                "tok_s": float(w["num_tokens_out"].sum() / wall_s) if wall_s > 0 else None,
                "requests_finished": int(w["num_finished"].sum()),
                "wall_s": float(wall_s),
                **mark,
            }
        )
    return rows


def slowdown(rows: list[dict], band: tuple[int, int]) -> dict:
    """Band medians of the first and last windows that have band steps, and their ratio."""
    have = [r for r in rows if r["band_median_ms"] is not None]
    if not have:
        return {"band": list(band), "first_ms": None, "last_ms": None, "ratio_last_first": None}
    first, last = have[0]["band_median_ms"], have[-1]["band_median_ms"]
    return {"band": list(band), "first_ms": first, "last_ms": last, "ratio_last_first": last / first}


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def print_windows(rows: list[dict], window: int, band: tuple[int, int], slow: dict) -> None:
    print(
        f"\n(a) over time, windows of {window} steps; 'band' = decode-only steps of "
        f"{band[0]}-{band[1]} rows\n"
        "| steps | decode-only steps | median ms | p90 ms | band steps | band median ms | tok/s "
        "| finished | active MB | RSS MB | KV blocks used |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['first_step']}-{r['first_step'] + r['steps'] - 1} | {r['decode_only_steps']} "
            f"| {_f(r['decode_only_median_ms'], '.2f')} | {_f(r['decode_only_p90_ms'], '.2f')} "
            f"| {r['band_steps']} | {_f(r['band_median_ms'], '.2f')} | {_f(r['tok_s'], ',.0f')} "
            f"| {r['requests_finished']} | {_f(r.get('active_mb'), ',.0f')} | {_f(r.get('rss_mb'), ',.0f')} "
            f"| {_f(r.get('kv_blocks_used'), ',')} |"
        )
    print(
        f"band median first {_f(slow['first_ms'], '.2f')} ms, last {_f(slow['last_ms'], '.2f')} ms, "
        f"last/first {_f(slow['ratio_last_first'], '.3f')}"
    )


# ---- (b) by composition -------------------------------------------------------------------------


def _groups(a: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    chunks, decode, tokens = a["num_chunks"], a["num_decode"], a["prefill_tokens"]
    groups = [
        ("decode only", chunks == 0),
        ("prefill only", (chunks > 0) & (decode == 0)),
        ("decode + prefill", (chunks > 0) & (decode > 0)),
    ]
    groups += [(f"{n} chunk{'s' if n > 1 else ''}", chunks == n) for n in (1, 2, 3)]
    groups.append(("4+ chunks", chunks >= 4))
    groups += [(name, (tokens >= lo) & (tokens <= hi)) for lo, hi, name in PREFILL_BUCKETS]
    for lo, hi in DECODE_BUCKETS:
        rows = f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
        groups.append((f"decode only, {rows} rows", (chunks == 0) & (decode >= lo) & (decode <= hi)))
    return groups


def composition(log: StepLog) -> list[dict]:
    a = log.arrays()
    total_ms = float(a["step_ms"].sum()) or 1.0
    rows = []
    for name, mask in _groups(a):
        if not mask.any():
            continue
        step = a["step_ms"][mask]
        phases = {p: float(a[f"{p}_ms"][mask].mean()) for p in PHASES}
        phases["rest"] = float(step.mean()) - sum(phases.values())
        rows.append(
            {
                "group": name,
                "steps": int(mask.sum()),
                "time_share": float(step.sum()) / total_ms,
                "median_ms": _pct(step, 50),
                "p90_ms": _pct(step, 90),
                "mean_ms": float(step.mean()),
                "mean_decode_rows": float(a["num_decode"][mask].mean()),
                "mean_prefill_tokens": float(a["prefill_tokens"][mask].mean()),
                "mean_phase_ms": phases,
            }
        )
    return rows


def print_composition(rows: list[dict]) -> None:
    names = (*PHASES, "rest")
    print(
        "\n(b) by composition (phases: mean ms; they add up to the mean)\n"
        "| steps of | steps | time % | median ms | p90 ms | mean ms | decode rows | prefill tok | "
        + " | ".join(names)
        + " |\n|---|"
        + "---|" * (8 + len(PHASES))
    )
    for r in rows:
        ph = " | ".join(f"{r['mean_phase_ms'][p]:.2f}" for p in names)
        print(
            f"| {r['group']} | {r['steps']} | {100 * r['time_share']:.1f} | {r['median_ms']:.2f} "
            f"| {r['p90_ms']:.2f} | {r['mean_ms']:.2f} | {r['mean_decode_rows']:.1f} "
            f"| {r['mean_prefill_tokens']:.0f} | {ph} |"
        )


# ---- (c) totals ---------------------------------------------------------------------------------


def print_totals(totals: dict) -> None:
    print("\n(c) totals\n| | |\n|---|---|")
    for key, value in totals.items():
        if value is None or isinstance(value, bool):
            shown = "-" if value is None else str(value)
        else:
            shown = f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
        print(f"| {key} | {shown} |")


# ---- the machine --------------------------------------------------------------------------------


def machine() -> dict:
    try:
        info = {k: v if isinstance(v, (int, float, str)) else str(v) for k, v in mx.device_info().items()}
    except Exception as exc:  # noqa: BLE001  (older MLX or a backend without it: say so, go on)
        info = {"error": str(exc)}
    versions = {"mlx": mx.__version__, "mlx-lm": _version("mlx-lm"), "python": platform.python_version()}
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "mlx_device": str(mx.default_device()),
        "device_info": info,
        "versions": versions,
        "env": {name: os.environ.get(name) for name in ENV_VARS},
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def memory_mark() -> dict:
    mark = {"active_mb": mx.get_active_memory() / 2**20, "peak_mb": mx.get_peak_memory() / 2**20}
    statm = Path("/proc/self/statm")
    if statm.exists():
        mark["rss_mb"] = int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return mark
