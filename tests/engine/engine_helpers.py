"""Helpers for engine tests on the real model: chat prompts, mlx-lm's greedy reference, a step driver."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, RequestOutput, SamplingParams

import mlx.core as mx
from mlx_lm.generate import generate_step


def chat_ids(llm: LLMEngine, text: str) -> list[int]:
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def reference_greedy(llm: LLMEngine, prompt: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's own greedy decoding on the same weights, stopping at EOS like the engine."""
    tokens = []
    for token, _ in generate_step(mx.array(prompt), llm.runner.model, max_tokens=max_tokens):
        token = int(token)
        if token in llm.eos_token_ids:
            break
        tokens.append(token)
    return tokens


def run_to_completion(
    llm: LLMEngine, arrivals: dict[int, list[GenerateRequest]]
) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = {}
    step = 0
    pending = dict(arrivals)
    while pending or llm.has_unfinished_requests():
        for request in pending.pop(step, []):
            llm.add_request(request)
        for output in llm.step():
            outputs.setdefault(output.request_id, []).append(output)
        step += 1
        assert step < 5000
    return outputs


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def token_ids(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]
