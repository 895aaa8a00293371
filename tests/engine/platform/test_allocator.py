"""engine/platform/allocator.py: glibc keeps MLX's freed CPU buffers mapped, so a step's activations reuse
pages instead of faulting them in again (with MLX_RAY_SERVE_MALLOC=default this prefill faulted
1.44 M pages)."""

import resource
import sys

from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.platform import allocator
from engine.platform.allocator import keep_heap

import pytest

from tests.engine.engine_helpers import run_to_completion


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _prefill(llm: LLMEngine, tag: str) -> None:
    ids = llm.tokenizer.encode(f"{tag}: " + " ".join(f"word{i}" for i in range(300)))
    request = GenerateRequest(tag, ids, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    run_to_completion(llm, {0: [request]})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables")
def test_a_warm_engine_prefills_without_faulting_its_buffers_in_again(llm):
    assert keep_heap().tuned, keep_heap().reason
    _prefill(llm, "warm-up")
    before = _minor_faults()
    _prefill(llm, "measured")
    assert _minor_faults() - before < 2000


def test_the_tunables_are_set_once_and_can_be_left_alone(monkeypatch):
    monkeypatch.setattr(allocator, "_state", None)
    monkeypatch.setenv("MLX_RAY_SERVE_MALLOC", "default")
    state = allocator.keep_heap()
    assert not state.tuned and "MLX_RAY_SERVE_MALLOC" in state.reason
    assert allocator.keep_heap() is state
