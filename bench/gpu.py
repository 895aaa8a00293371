"""GPU benchmark of the engine against mlx-lm on a random-weight Llama-3.2-1B-shaped model. No network.

    python bench/gpu.py [--out bench/results/gpu.json] [--batches 1,8,32,64,128] [--max-tokens 128]

Rows: the two ceilings (bf16 matmul TFLOP/s, copy GB/s counting bytes read and written); decode
tokens/s of this engine and of mlx-lm's BatchGenerator at each batch size, each as a share of the
memory-bandwidth roofline (every weight read once per step: batch x copy bandwidth / weight bytes);
prefill tokens/s of one 2,048-token prompt as a share of the matmul roofline (2 x non-embedding
parameters FLOPs per token); and a greedy check (`--check`) that the GPU engine's tokens match the
CPU engine's and mlx-lm's.

The model: mlx-lm's `llama` architecture with Llama-3.2-1B's config and random bf16 weights, saved
as an mlx-lm directory with a generated word-level tokenizer ("t0".."t128255"), so the engine loads
it through its ordinary `EngineConfig(model=<dir>)` path.
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

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX on CPU-only machines)
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load as mlx_lm_load

LLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
}
TINY = {**LLAMA_1B, "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 4096}


# ---- the model ----------------------------------------------------------------------------------


def build_model_dir(path: Path, config: dict, seed: int = 0) -> int:
    """Writes config, random bf16 weights and a word-level tokenizer; returns the parameter count."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config))
    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t0", "eos_token": "t1"}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return sum(v.size for v in weights.values())


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    keys = mx.random.randint(2, vocab, (n, length), key=mx.random.key(seed))
    return keys.tolist()


# ---- ceilings -----------------------------------------------------------------------------------


def timed(fn, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        mx.eval(fn())
    t0 = time.perf_counter()
    for _ in range(iters):
        mx.eval(fn())
    return (time.perf_counter() - t0) / iters


def ceilings(n: int = 8192, copy_elems: int = 1 << 29) -> dict:
    a = mx.random.normal((n, n)).astype(mx.bfloat16)
    b = mx.random.normal((n, n)).astype(mx.bfloat16)
    matmul_s = timed(lambda: a @ b, 20)
    x = mx.random.normal((copy_elems,)).astype(mx.bfloat16)  # 1 GiB by default
    copy_s = timed(lambda: x + 1, 20)
    return {"matmul_tflops": 2 * n**3 / matmul_s / 1e12, "copy_gbs": 2 * x.nbytes / copy_s / 1e9}


# ---- decode -------------------------------------------------------------------------------------


def engine_decode(llm: LLMEngine, batch: list[list[int]], max_tokens: int) -> float:
    """Tokens/s from the moment every request has its first token until all finish (decode only)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tag = time.monotonic_ns()
    for i, ids in enumerate(batch):
        llm.add_request(GenerateRequest(f"d{tag}-{i}", ids, params))
    started: set[str] = set()
    t0, num_tokens = None, 0
    while llm.has_unfinished_requests():
        for out in llm.step():
            if t0 is not None:
                num_tokens += len(out.new_token_ids)
            elif out.new_token_ids:
                started.add(out.request_id)
        if t0 is None and len(started) == len(batch):
            t0 = time.perf_counter()
    return num_tokens / (time.perf_counter() - t0)


def batchgen_decode(model, batch: list[list[int]], max_tokens: int) -> float:
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=[], completion_batch_size=len(batch))
    gen.insert(batch, [max_tokens] * len(batch))
    started: set[int] = set()
    t0, num_tokens = None, 0
    while responses := gen.next_generated():
        for r in responses:
            if t0 is not None:
                num_tokens += 1
            else:
                started.add(r.uid)
        if t0 is None and len(started) == len(batch):
            t0 = time.perf_counter()
    gen.close()
    return num_tokens / (time.perf_counter() - t0)


# ---- prefill ------------------------------------------------------------------------------------


def engine_prefill(llm: LLMEngine, ids: list[int]) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    llm.add_request(GenerateRequest(f"p{time.monotonic_ns()}", ids, params))
    t0 = time.perf_counter()
    while llm.has_unfinished_requests():
        llm.step()
    return len(ids) / (time.perf_counter() - t0)


def mlx_lm_prefill(model, ids: list[int]) -> float:
    cache = make_prompt_cache(model)
    tokens = mx.array([ids])
    t0 = time.perf_counter()
    mx.eval(model(tokens, cache=cache)[:, -1])
    return len(ids) / (time.perf_counter() - t0)


# ---- greedy check -------------------------------------------------------------------------------


def engine_greedy(model_dir: Path, device: str, dtype: str, batch: list[list[int]], n: int) -> list[dict]:
    """All prompts at once (a padded decode bucket on the GPU); per prompt its tokens and top-5 logprobs."""
    llm = LLMEngine(_engine_config(model_dir, device, dtype, max_num_seqs=len(batch)))
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=5)
    runs: dict[str, dict] = {f"c{i}": {"tokens": [], "top": []} for i in range(len(batch))}
    for i, ids in enumerate(batch):
        llm.add_request(GenerateRequest(f"c{i}", ids, params))
    while llm.has_unfinished_requests():
        for out in llm.step():
            runs[out.request_id]["tokens"] += out.new_token_ids
            runs[out.request_id]["top"] += [lp.top for lp in out.logprobs or []]
    return [runs[f"c{i}"] for i in range(len(batch))]


def mlx_lm_greedy(model, batch: list[list[int]], n: int) -> list[dict]:
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


def greedy_check(model_dir: Path, model, vocab: int, n: int = 32) -> dict:
    """Three prompts, greedy, four ways: tokens and top-5 logprobs compared pairwise."""
    batch = [prompts(1, length, vocab, seed=7 + length)[0] for length in (12, 21, 40)]
    gpu = "gpu" if mx.is_available(mx.gpu) else "cpu"  # "cpu" only in a --tiny smoke run
    runs = {
        "engine_gpu_bf16": engine_greedy(model_dir, gpu, "bfloat16", batch, n),
        "mlx_lm_gpu_bf16": mlx_lm_greedy(model, batch, n),
        "engine_gpu_f32": engine_greedy(model_dir, gpu, "float32", batch, n),
        "engine_cpu_f32": engine_greedy(model_dir, "cpu", "float32", batch, n),
    }
    mx.set_default_device(mx.Device(getattr(mx, gpu)))
    pairs = {
        "gpu_f32_vs_cpu_f32": ("engine_gpu_f32", "engine_cpu_f32"),
        "gpu_bf16_vs_mlx_lm_bf16": ("engine_gpu_bf16", "mlx_lm_gpu_bf16"),
        "gpu_bf16_vs_cpu_f32": ("engine_gpu_bf16", "engine_cpu_f32"),
    }
    return {"tokens": n, "runs": runs, **{k: compare(runs[a], runs[b]) for k, (a, b) in pairs.items()}}


# ---- the run ------------------------------------------------------------------------------------


def _engine_config(model_dir: Path, device: str, dtype: str, max_num_seqs: int) -> EngineConfig:
    return EngineConfig(
        model=str(model_dir),
        device=device,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=8 << 30,
        enable_prefix_caching=False,
    )


def machine() -> str:
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    name = info.get("device_name") or info.get("architecture") or str(mx.default_device())
    return f"{name}, {platform.machine()}, MLX {mx.__version__}"


def decode_rows(
    llm: LLMEngine, ref, batches: list[int], max_tokens: int, roof: float, vocab: int
) -> list[dict]:
    print(
        "\n| batch | engine tok/s | BatchGenerator tok/s | engine/BatchGenerator | engine % roofline | BatchGenerator % roofline |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    for b in batches:
        batch = prompts(b, 32, vocab, seed=b)
        engine_decode(llm, batch, 8)  # warm-up: compiles this batch's kernels
        batchgen_decode(ref, batch, 8)
        ours = engine_decode(llm, batch, max_tokens)
        theirs = batchgen_decode(ref, batch, max_tokens)
        row = {"batch": b, "engine_tok_s": ours, "batchgen_tok_s": theirs, "roofline_tok_s": b * roof}
        rows.append(row)
        print(
            f"| {b} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x | {100 * ours / (b * roof):.1f}% "
            f"| {100 * theirs / (b * roof):.1f}% |",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu.json")
    parser.add_argument("--batches", default="1,8,32,64,128")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--check", action="store_true", help="also run the greedy token check")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model: a quick smoke run on a CPU")
    args = parser.parse_args()
    results: dict = {"machine": machine(), "model": "random-weight Llama-3.2-1B shape, bf16"}
    shape = TINY if args.tiny else LLAMA_1B
    results["ceilings"] = ceil = ceilings(1024, 1 << 22) if args.tiny else ceilings()
    print(
        f"{results['machine']}\nmatmul {ceil['matmul_tflops']:.0f} TFLOP/s, copy {ceil['copy_gbs']:,.0f} GB/s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        num_params = build_model_dir(model_dir, shape)
        embed = shape["vocab_size"] * shape["hidden_size"]
        weight_bytes = 2 * num_params
        roof = ceil["copy_gbs"] * 1e9 / weight_bytes  # steps/s when each step reads every weight once
        results.update(num_params=num_params, weight_bytes=weight_bytes, roofline_steps_s=roof)
        print(f"{num_params / 1e9:.3f} B parameters, roofline {roof:,.0f} steps/s")
        batches = [int(x) for x in args.batches.split(",")]
        llm = LLMEngine(_engine_config(model_dir, "auto", "auto", max(batches)))
        # mlx-lm gets its own copy of the weights: on CUDA the engine rewrites its model's MLPs.
        ref, _ = mlx_lm_load(str(model_dir))
        results["decode"] = decode_rows(llm, ref, batches, args.max_tokens, roof, shape["vocab_size"])
        ids = prompts(1, args.prompt_len, shape["vocab_size"], seed=1)[0]
        engine_prefill(llm, ids)
        mlx_lm_prefill(ref, ids)
        prefill_roof = ceil["matmul_tflops"] * 1e12 / (2 * (num_params - embed))
        results["prefill"] = {
            "prompt_len": args.prompt_len,
            "engine_tok_s": engine_prefill(llm, ids),
            "mlx_lm_tok_s": mlx_lm_prefill(ref, ids),
            "roofline_tok_s": prefill_roof,
        }
        p = results["prefill"]
        print(
            f"\nprefill {args.prompt_len} tokens: engine {p['engine_tok_s']:,.0f} tok/s "
            f"({100 * p['engine_tok_s'] / prefill_roof:.0f}% of matmul roofline), mlx-lm "
            f"{p['mlx_lm_tok_s']:,.0f} tok/s ({100 * p['mlx_lm_tok_s'] / prefill_roof:.0f}%)"
        )
        if args.check:
            results["greedy_check"] = check = greedy_check(model_dir, ref, shape["vocab_size"])
            print(f"\ngreedy check, 3 prompts x {check['tokens']} tokens:")
            for key in ("gpu_f32_vs_cpu_f32", "gpu_bf16_vs_mlx_lm_bf16", "gpu_bf16_vs_cpu_f32"):
                print(f"  {key}: {check[key]}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
