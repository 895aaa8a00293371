"""Markdown table and machine description for `bench/serve.py`; formatting only, no I/O to servers."""

from __future__ import annotations

import os
import platform
from pathlib import Path

COLUMNS = [
    ("server", "server"),
    ("concurrency", "conc"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "TTFT p90 ms"),
    ("itl_mean_ms", "ITL ms"),
    ("chunk_gap_p50_ms", "gap p50 ms"),
    ("chunk_gap_p90_ms", "gap p90 ms"),
    ("aggregate_tok_s", "tok/s"),
    ("completion_tokens_mean", "tokens/req"),
    ("prompt_tokens_mean", "prompt tok"),
    ("cpu_ms_per_token_total", "CPU ms/token"),
    ("cpu_split", "CPU by process, ms/token"),
    ("errors", "errors"),
]
CPU_SPLIT_TOP = 4  # process kinds named in the split; the rest are "other"


def markdown_table(servers: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for server in servers:
        if server.get("error"):
            cells = [
                _label(server),
                "-",
                *["-"] * (len(COLUMNS) - 3),
                f"failed: {_one_line(server['error'])}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        for level in server["levels"]:
            cpu = level.get("cpu_ms_per_token") or {}
            row = {
                **level,
                "cpu_ms_per_token_total": cpu.get("total"),
                "cpu_split": cpu_split(cpu) or None,
                "server": _label(server),
                "errors": f"{level['num_errors']}/{level['num_requests']}",
            }
            lines.append("| " + " | ".join(_fmt(row.get(key)) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def cpu_split(cpu_ms_per_token: dict[str, float]) -> str:
    """The largest process kinds' CPU ms per token, e.g. "Scheduler 9.1, Ingress 2.3, other 0.4"."""
    parts = [(k, v) for k, v in cpu_ms_per_token.items() if k != "total"]
    top = parts[:CPU_SPLIT_TOP]
    rest = sum(v for _, v in parts[CPU_SPLIT_TOP:])
    named = [f"{k} {v:.2f}" for k, v in top] + ([f"other {rest:.2f}"] if rest else [])
    return ", ".join(named)


def _label(server: dict) -> str:
    return f"{server['name']} #{server['run']}" if server.get("run", 1) > 1 else server["name"]


def comparison_table(servers: list[dict]) -> str:
    """One row per server, runs side by side ("run 1 / run 2"): tok/s at every concurrency, then TTFT,
    ITL and chunk gaps at the highest one."""
    by_name: dict[str, list[dict]] = {}
    for server in servers:
        by_name.setdefault(server["name"], []).append(server)
    concs = sorted({lv["concurrency"] for s in servers for lv in s.get("levels", [])})
    if not concs:
        return ""
    top = concs[-1]
    heads = [f"c={c} tok/s" for c in concs] + [f"{h} @{top}" for h in
             ("TTFT p50 ms", "ITL ms", "gap p50 ms", "gap p90 ms", "tokens/req", "CPU ms/token")]  # fmt: skip
    keys = [(c, "aggregate_tok_s") for c in concs] + [(top, k) for k in
            ("ttft_p50_ms", "itl_mean_ms", "chunk_gap_p50_ms", "chunk_gap_p90_ms", "completion_tokens_mean",
             "cpu_ms_per_token_total")]  # fmt: skip
    lines = ["| server | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1)]
    for name, runs in by_name.items():
        cells = [" / ".join(_level_value(run, conc, key) for run in runs) for conc, key in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _level_value(server: dict, concurrency: int, key: str) -> str:
    if server.get("error"):
        return "failed"
    level = next((lv for lv in server.get("levels", []) if lv["concurrency"] == concurrency), None)
    if level is None:
        return "-"
    value = (
        level.get(key)
        if key != "cpu_ms_per_token_total"
        else (level.get("cpu_ms_per_token") or {}).get("total")
    )
    if level["num_errors"]:
        return f"{_fmt(value)} ({level['num_errors']} err)"
    return _fmt(value)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _one_line(text: str, limit: int = 160) -> str:
    return " ".join(text.split())[:limit].replace("|", "/")


def notes(servers: list[dict]) -> str:
    out = []
    for s in servers:
        blas = s.get("blas") or {}
        if blas.get("note"):
            blas_text = f"{blas['note']} ({blas.get('num_threads')} threads)"
        else:
            blas_text = (f"patched OpenBLAS in every MLX process: {blas.get('ok')} "
                         f"(OPENBLAS_NUM_THREADS {blas.get('openblas_num_threads')})")  # fmt: skip
        sources = sorted({src for lv in s.get("levels", []) for src in lv["token_count_sources"]})
        out.append(
            f"- {_label(s)}: versions {s.get('versions')}, EOS suppressed by {s.get('eos_mode')}, "
            f"{blas_text}, tokens counted from {sources}"
        )
        for level in s.get("levels", []):
            for sample in level["error_samples"]:
                out.append(f"  - conc {level['concurrency']} error: {_one_line(sample, 300)}")
    return "\n".join(out)


def recorded_out(path: str, repo: Path) -> str:
    """`--out` as committed results name it: relative inside the checkout, else the file name alone."""
    resolved = (repo / path).resolve()
    return str(resolved.relative_to(repo)) if resolved.is_relative_to(repo) else resolved.name


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str | None:
    for line in _text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _mem_gib() -> float | None:
    for line in _text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def _text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
