"""bench/serve.py's stream smoothness numbers: chunk gaps pooled over a level, and runs side by side."""

from __future__ import annotations

from bench.serve_load import LevelResult, _result, result_dicts
from bench.serve_report import comparison_table


def _stream(t0: float, chunk_times: list[float], tokens: int):
    return _result(t0, chunk_times, {"completion_tokens": tokens, "prompt_tokens": 200})


def test_chunk_gaps_are_pooled_over_the_level_and_exclude_the_first_token_wait():
    # Stream a: TTFT 5 s, then chunks every 0.1 s. Stream b: chunks 0.6 s apart (batched delivery).
    a = _stream(0.0, [5.0, 5.1, 5.2, 5.3, 5.4], tokens=5)
    b = _stream(0.0, [1.0, 1.6, 2.2], tokens=8)
    summary = LevelResult(2, 2, 6.0, [a, b]).summary()
    # Six gaps: four of 100 ms and two of 600 ms; the 5 s before the first chunk is TTFT, not a gap.
    assert round(summary["chunk_gap_p50_ms"]) == 100
    assert round(summary["chunk_gap_p90_ms"]) == 600
    assert round(summary["ttft_p50_ms"]) == 1000


def test_request_json_keeps_gap_percentiles_not_every_gap():
    level = LevelResult(1, 1, 3.0, [_stream(0.0, [1.0, 1.6, 2.2, 2.3], tokens=4)])
    (row,) = result_dicts(level)
    assert "chunk_gaps_s" not in row
    assert (row["chunk_gap_p50_ms"], row["chunk_gap_max_ms"]) == (600.0, 600.0)


def _server(name: str, run: int, tok_s: float, gap_ms: float) -> dict:
    level = {"concurrency": 16, "num_errors": 0, "aggregate_tok_s": tok_s, "ttft_p50_ms": 900.0,
             "itl_mean_ms": 80.0, "chunk_gap_p50_ms": gap_ms, "chunk_gap_p90_ms": gap_ms,
             "completion_tokens_mean": 128.0}  # fmt: skip
    return {"name": name, "run": run, "levels": [level]}


def test_comparison_table_puts_both_orders_of_a_server_in_one_row():
    servers = [_server("ours", 1, 160.0, 640.0), _server("llama-server-f32", 1, 210.0, 48.0),
               _server("llama-server-f32", 2, 219.4, 58.0), _server("ours", 2, 166.7, 620.0),
               {"name": "llama-cpp-python-f32", "run": 1, "error": "install failed"}]  # fmt: skip
    rows = comparison_table(servers).splitlines()
    ours = next(r for r in rows if r.startswith("| ours |"))
    assert "160.0 / 166.7" in ours and "640.0 / 620.0" in ours
    assert "failed" in next(r for r in rows if r.startswith("| llama-cpp-python-f32 |"))
