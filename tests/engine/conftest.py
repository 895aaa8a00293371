import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

import pytest


@pytest.fixture(scope="session")
def llm() -> LLMEngine:
    return LLMEngine(
        EngineConfig(kv_cache_memory_bytes=256 << 20, max_num_seqs=16, max_num_batched_tokens=128)
    )


@pytest.fixture(scope="session")
def async_llm() -> LLMEngine:
    """The same engine with asynchronous scheduling forced on (auto turns it on only on a GPU)."""
    return LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=256 << 20,
            max_num_seqs=16,
            max_num_batched_tokens=128,
            async_scheduling=True,
        )
    )
