"""Run as a script by tests/engine/platform/test_blas.py in a fresh process (OPENBLAS_CORETYPE is read when
OpenBLAS loads): loads the engine, greedy-decodes the bundled model, prints the tokens and the BLAS."""

import json
import sys

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams
from engine.platform.blas import blas_state

from tests.engine.engine_helpers import chat_ids, run_to_completion, token_ids

PROMPTS = ["What is the capital of France?", "Name three colours.", "Count from one to five."]


def main() -> None:
    llm = LLMEngine(EngineConfig(kv_cache_memory_bytes=32 << 20, max_num_seqs=4, max_num_batched_tokens=64))
    params = SamplingParams(max_tokens=int(sys.argv[1]), temperature=0.0, ignore_eos=True)
    # Arriving together: prefill chunks and decode rows of several sequences, as served.
    requests = [GenerateRequest(str(i), chat_ids(llm, text), params) for i, text in enumerate(PROMPTS)]
    outputs = run_to_completion(llm, {0: requests})
    blas = blas_state()
    paths = llm.stats().compute
    print(json.dumps({
        "tokens": [token_ids(outputs[r.request_id]) for r in requests],
        "blas": blas.name, "config": blas.config, "core": blas.core,
        "decode": paths.decode if paths else None,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
