"""Architectures: how the engine keeps each one's caches and which paths serve it, and the decode speed of
an attention model against a hybrid recurrent model of the same size. Feeds docs/models.md.

    python bench/models.py --table --out bench/results/models_table.json
    python bench/models.py --speed --out bench/results/models_speed.json [--max-tokens 64] [--rounds 3]

`--table`: one tiny random-weight model per architecture of tests/architectures.py (hidden 64, 4 layers):
its cache layers, whether decode rows batch, the prefix cache, and the decode/attention/math/prefill
paths /v1/status reports on this machine.
`--speed`: qwen3 (attention in every layer) against qwen3_5 (the same dense shape with linear attention
in 6 of 8 layers), and qwen3_next (qwen3_5's layers with 8-expert MoE MLPs), at hidden 512, 8 layers,
random float32 weights: decode tok/s of 1 and 16 sequences of ~100-token prompts, EOS ignored; the
engine against mlx-lm's own generate_step for one sequence.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import platform
import statistics
import tempfile
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.cpu.activation_hook import stock

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step

from bench.engine import engine_decode
from tests.architectures import ARCHITECTURES, SEEDS
from tests.tiny_text_model import build_tiny_model

SPEED_SHAPE = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 1536,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 32000,
}
_LINEAR = {
    "linear_num_value_heads": 8,
    "linear_num_key_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "full_attention_interval": 4,
}
SPEED_MODELS = {
    "qwen3": {"model_type": "qwen3"},
    "qwen3_5": {  # dense like qwen3: the same size but 6 of 8 layers linear attention
        "model_type": "qwen3_5",
        "text_config": {**ARCHITECTURES["qwen3_5"]["text_config"], **SPEED_SHAPE, **_LINEAR},
    },
    "qwen3_next": {
        **ARCHITECTURES["qwen3_next"],
        **_LINEAR,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 384,
        "shared_expert_intermediate_size": 384,
    },
}


def table_row(arch: str, folder: Path) -> dict:
    path = build_tiny_model(folder / arch, ARCHITECTURES[arch], seed=SEEDS.get(arch, 0))
    c = LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=16 << 20, max_num_seqs=8)).compute
    return {
        "arch": arch,
        "cache_layers": c.cache_layers,
        "decode_rows": c.decode_rows,
        "prefix_cache": c.prefix_cache,
        "paths": f"{c.decode} / {c.attention} / {c.math} / {c.prefill}",
    }


def _prompts(n: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(100, vocab - 1, size=96 + 4 * i).tolist() for i in range(n)]


def speed_rows(folder: Path, max_tokens: int, rounds: int) -> list[dict]:
    rows = []
    for name, config in SPEED_MODELS.items():
        path = build_tiny_model(folder / name, {**config, **SPEED_SHAPE})
        llm = LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=256 << 20, max_num_seqs=16))
        prompts = _prompts(16, SPEED_SHAPE["vocab_size"])
        engine_decode(llm, prompts[:2], 8)  # warm-up: kernels, first allocations
        one = [engine_decode(llm, prompts[:1], max_tokens)["tok_s"] for _ in range(rounds)]
        many = [engine_decode(llm, prompts, max_tokens)["tok_s"] for _ in range(rounds)]
        rows.append(
            {
                "model": name,
                "cache_layers": llm.compute.cache_layers,
                "engine_1_seq_tok_s": statistics.median(one),
                "engine_16_seq_tok_s": statistics.median(many),
                "mlx_lm_1_seq_tok_s": _mlx_lm_tok_s(llm, prompts[0], max_tokens, rounds),
                "paths": f"{llm.compute.decode} / {llm.compute.attention} / {llm.compute.math}",
            }
        )
    return rows


def _mlx_lm_tok_s(llm: LLMEngine, prompt: list[int], max_tokens: int, rounds: int) -> float:
    rates = []
    with stock(llm.runner.model):
        for _ in range(rounds):
            steps = generate_step(mx.array(prompt), llm.runner.model, max_tokens=max_tokens + 1)
            next(steps)  # the prefill's token
            t0 = time.perf_counter()
            n = sum(1 for _ in steps)
            rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def _print(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[k]:.1f}" if isinstance(row[k], float) else str(row[k]) for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.table:
            result["table"] = [table_row(arch, Path(tmp)) for arch in sorted(ARCHITECTURES)]
            _print(result["table"])
        if args.speed:
            result["speed"] = speed_rows(Path(tmp), args.max_tokens, args.rounds)
            _print(result["speed"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
