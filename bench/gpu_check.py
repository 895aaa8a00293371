"""The greedy check of bench/gpu.py: the same prompts decoded greedily by the engine on the GPU (bf16, float32),
on the CPU (float32) and by mlx-lm, one model in memory at a time, compared token by token and by top-5
logprobs. Owns only running and comparing; the configs and prompts are gpu.py's.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load as mlx_lm_load

PAIRS = {
    "gpu_f32_vs_cpu_f32": ("engine_gpu_f32", "engine_cpu_f32"),
    "gpu_bf16_vs_mlx_lm_bf16": ("engine_gpu_bf16", "mlx_lm_gpu_bf16"),
    "gpu_bf16_vs_cpu_f32": ("engine_gpu_bf16", "engine_cpu_f32"),
}


def greedy_check(
    model_dir: Path,
    batch: list[list[int]],
    configs: dict[str, EngineConfig],
    log: Callable[[str], None],
    n: int = 32,
) -> dict:
    """`configs` names the engines engine_gpu_bf16, engine_gpu_f32 and engine_cpu_f32; mlx-lm runs as
    mlx_lm_gpu_bf16. Returns every run's tokens and top-5 logprobs and each pair of PAIRS compared."""
    device = mx.default_device()
    runs = {}
    for name in ("engine_gpu_bf16", "mlx_lm_gpu_bf16", "engine_gpu_f32", "engine_cpu_f32"):
        if name in configs:
            runs[name] = engine_greedy(configs[name], batch, n)
        else:
            runs[name] = mlx_lm_greedy(model_dir, batch, n)
        mx.set_default_device(device)  # the CPU engine moved it
        gc.collect()
        mx.clear_cache()
        log(f"check: {name} done")
    return {"tokens": n, "runs": runs, **{k: compare(runs[a], runs[b]) for k, (a, b) in PAIRS.items()}}


def engine_greedy(config: EngineConfig, batch: list[list[int]], n: int) -> list[dict]:
    """All prompts at once (a padded decode bucket on the GPU); per prompt its tokens and top-5 logprobs."""
    llm = LLMEngine(config)
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=5)
    runs: dict[str, dict] = {f"c{i}": {"tokens": [], "top": []} for i in range(len(batch))}
    for i, ids in enumerate(batch):
        llm.add_request(GenerateRequest(f"c{i}", ids, params))
    while llm.has_unfinished_requests():
        for out in llm.step():
            runs[out.request_id]["tokens"] += out.new_token_ids
            runs[out.request_id]["top"] += [lp.top for lp in out.logprobs or []]
    llm.close()
    return [runs[f"c{i}"] for i in range(len(batch))]


def mlx_lm_greedy(model_dir: Path, batch: list[list[int]], n: int) -> list[dict]:
    model, _ = mlx_lm_load(str(model_dir))
    runs = []
    for ids in batch:
        tokens, top = [], []
        for token, logprobs in generate_step(mx.array(ids), model, max_tokens=n):
            best = mx.argsort(-logprobs)[:5].tolist()
            tokens.append(int(token))
            top.append([(t, logprobs[t].item()) for t in best])
        runs.append({"tokens": tokens, "top": top})
    return runs


def compare(a: list[dict], b: list[dict]) -> dict:
    """Leading tokens equal (fewest over prompts); over the steps that share a context (up to and
    including the first differing token), how many top-5 sets match and the largest logprob gap."""
    leading, same_top, steps, worst = [], 0, 0, 0.0
    for x, y in zip(a, b):
        pairs = list(zip(x["tokens"], y["tokens"]))
        lead = next((i for i, (p, q) in enumerate(pairs) if p != q), len(pairs))
        leading.append(lead)
        for tx, ty in list(zip(x["top"], y["top"]))[: lead + 1]:
            steps += 1
            dx, dy = dict(tx), dict(ty)
            same_top += set(dx) == set(dy)
            worst = max([worst] + [abs(dx[t] - dy[t]) for t in dx.keys() & dy.keys()])
    return {
        "leading_tokens_equal": min(leading),
        "top5_same_steps": same_top,
        "shared_context_steps": steps,
        "max_logprob_diff": worst,
    }
