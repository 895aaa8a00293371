"""Vision architectures: what the engine does with each mlx-vlm architecture, and what the encoder cache
saves on a conversation that resends its picture. Feeds docs/models.md and docs/vision.md.

    python bench/vision_models.py --table --out bench/results/vision_table.json
    python bench/vision_models.py --encoder-cache --out bench/results/vision_encoder_cache.json

`--table`: one tiny random-weight model per architecture of tests/vision_architectures.py: the vision
inputs /v1/status reports for it (`compute.vision`), or the reason the engine refuses it at load, and
the reason no tiny model of it is built.
`--encoder-cache`: a Qwen3-VL-shaped model with a larger vision tower (random float32 weights) answers a
3-turn conversation that sends the same 448x448 picture each turn; time to first token of each turn
with the encoder cache on and off, measured in the same run.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import platform
import tempfile
import time

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

from tests.tiny_vlms.common import png_bytes
from tests.vision_architectures import BUILDERS, NOT_BUILDABLE


def table() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for model_type in sorted(BUILDERS):
            path = BUILDERS[model_type](Path(root) / model_type, 0)
            try:
                llm = LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=16 << 20, block_size=4))
                rows.append({"architecture": model_type, "served": True, "vision": llm.compute.vision})
            except ModelLoadError as exc:
                reason = str(exc).split("Error: ", 1)[-1].split(". Set engine.model", 1)[0]
                rows.append({"architecture": model_type, "served": False, "vision": f"refused: {reason}"})
            print(
                f"| {model_type} | {'yes' if rows[-1]['served'] else 'no'} | {rows[-1]['vision']} |",
                flush=True,
            )
    for model_type, reason in sorted(NOT_BUILDABLE.items()):
        rows.append({"architecture": model_type, "served": None, "vision": f"not built here: {reason}"})
        print(f"| {model_type} | - | not built here: {reason} |", flush=True)
    return rows


def encoder_cache() -> list[dict]:
    from tests.tiny_vlms.core import build_qwen3_vl

    with tempfile.TemporaryDirectory() as root:
        path = build_qwen3_vl(Path(root) / "qwen3_vl", 0, vision_scale=True)
        picture = png_bytes(7, (448, 448))
        rows = []
        for cache_bytes in (256 << 20, 0):
            llm = LLMEngine(
                EngineConfig(model=str(path), encoder_cache_bytes=cache_bytes, max_num_batched_tokens=2048)
            )
            from engine.prompt.image_processor import ImagePreprocessor

            processor = ImagePreprocessor.load(str(path))
            messages = [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}
            ]
            for turn in range(1, 4):
                text = processor.processor.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
                ids, images = processor.process(text, [picture], 10**8)
                ttft = _ttft(llm, ids, images)
                rows.append(
                    {
                        "encoder_cache": cache_bytes > 0,
                        "turn": turn,
                        "prompt_tokens": len(ids),
                        "ttft_s": ttft,
                    }
                )
                print(
                    f"| {'on' if cache_bytes else 'off'} | {turn} | {len(ids)} | {ttft * 1000:.0f} ms |",
                    flush=True,
                )
                messages += [
                    {"role": "assistant", "content": f"Answer {turn}."},
                    {"role": "user", "content": "More?"},
                ]
    return rows


def _ttft(llm: LLMEngine, ids: list[int], images) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.add_request(GenerateRequest(f"r{start}", ids, params, images))
    while llm.has_unfinished_requests():
        llm.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--encoder-cache", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {"machine": platform.processor() or platform.machine(), "cpus": __import__("os").cpu_count()}
    if args.table:
        print("| architecture | served | vision inputs / reason |\n|---|---|---|")
        result["table"] = table()
    if args.encoder_cache:
        print("| encoder cache | turn | prompt tokens | time to first token |\n|---|---|---|---|")
        result["encoder_cache"] = encoder_cache()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
