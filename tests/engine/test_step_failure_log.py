"""A step that raises fails the requests it ran, and logs its traceback once with their ids: the
requests' error carries only the message, so the log is where an operator finds where it broke."""

import logging
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest

import pytest

from tests.engine.engine_helpers import greedy, run_to_completion
from tests.tiny_text_model import build_tiny_model


def _exploding_kernel(*args: object) -> None:
    raise RuntimeError("the kernel exploded")


def test_a_failed_step_logs_its_traceback_once_with_the_request_ids(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    path = build_tiny_model(tmp_path / "llama", {"model_type": "llama", "num_hidden_layers": 2})
    llm = LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=4 << 20, cpu_decode=False))
    monkeypatch.setattr(llm.runner, "execute", _exploding_kernel)
    requests = [GenerateRequest(rid, [20 + i] * 5, greedy(4)) for i, rid in enumerate(("req-a", "req-b"))]
    with caplog.at_level(logging.ERROR, logger="engine.llm_engine"):
        outputs = run_to_completion(llm, {0: requests})

    for rid in ("req-a", "req-b"):
        last = outputs[rid][-1]
        assert last.finish_reason == "error" and "the kernel exploded" in (last.error or "")
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1
    assert "req-a" in logged[0].getMessage() and "req-b" in logged[0].getMessage()
    assert "_exploding_kernel" in caplog.text  # the traceback, down to the frame that raised
    assert not llm.has_unfinished_requests()
