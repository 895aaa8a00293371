"""The 4-bit rows kernel (engine/runner/cuda/quantized_rows.py) alone on a GPU: agreement and time per product.

    python bench/gpu_quantized_rows.py [--out bench/results/gpu_quantized_rows.json]

For Llama-3.2-1B's and Llama-3.1-8B's projection shapes (random bf16 weights quantized as mlx-lm does:
affine, 4 bits, groups of 64): the largest difference of the kernel and of `mx.quantized_matmul` from a
float32 product over the same dequantized weights, as a share of its largest output, at 2 to 128 rows;
then ms per product of the kernel, of `mx.quantized_matmul` and of a bf16 cuBLAS product of the same
shape, each 50 products evaluated together. Those times include MLX's host cost per product where it
exceeds the GPU's; the engine's decode (bench/gpu.py, `--baseline cuda_quantized_rows=false`) is the
measure that counts. Prints a table and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import time
from functools import partial

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import quantized_rows as qr

import mlx.core as mx
from mlx import nn

from bench.gpu import device_name, table

AGREE_SHAPES = [(3072, 2048), (4096, 4096), (4096, 14336), (6144, 4096)]
AGREE_ROWS = [2, 3, 7, 8, 9, 16, 33, 64, 100, 128]
TIME_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
TIME_ROWS = [8, 64]


def quantized(n: int, k: int, seed: int) -> nn.QuantizedLinear:
    linear = nn.Linear(k, n, bias=False)
    linear.weight = (mx.random.normal((n, k), key=mx.random.key(seed)) * 0.02).astype(mx.bfloat16)
    layer = nn.QuantizedLinear.from_linear(linear, group_size=64, bits=4)
    mx.eval(layer.parameters())
    return layer


def agreement() -> list[dict]:
    rows_out = []
    for n, k in AGREE_SHAPES:
        layer = quantized(n, k, n + k)
        weight = mx.dequantize(layer.weight, layer.scales, layer.biases, 64, 4).astype(mx.float32)
        for rows in AGREE_ROWS:
            x = mx.random.normal((rows, k), key=mx.random.key(rows)).astype(mx.bfloat16)
            ref = x.astype(mx.float32) @ weight.T
            scale = mx.abs(ref).max()
            got = qr.matmul_t(x, layer.weight, layer.scales, layer.biases).astype(mx.float32)
            mlx = layer(x).astype(mx.float32)
            rows_out.append(
                {
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "kernel_vs_f32": (mx.abs(got - ref).max() / scale).item(),
                    "mlx_vs_f32": (mx.abs(mlx - ref).max() / scale).item(),
                }
            )
    return rows_out


def ms_per_product(f, x: mx.array, reps: int = 50) -> float:
    for _ in range(3):
        mx.eval(f(x))
    mx.synchronize()
    start = time.perf_counter()
    mx.eval(*[f(x) for _ in range(reps)])
    mx.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def _times_t(weight: mx.array, x: mx.array) -> mx.array:
    return x @ weight.T


def timings() -> list[dict]:
    rows_out = []
    for n, k in TIME_SHAPES:
        layer = quantized(n, k, 1)
        dense = (mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16)
        mx.eval(dense)
        for rows in TIME_ROWS:
            x = mx.random.normal((rows, k)).astype(mx.bfloat16)
            mx.eval(x)
            kernel = partial(qr.matmul_t, w=layer.weight, scales=layer.scales, biases=layer.biases)
            rows_out.append(
                {
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "slices": qr.num_slices(n, k, rows),
                    "kernel_ms": ms_per_product(kernel, x),
                    "mlx_4bit_ms": ms_per_product(layer, x),
                    "bf16_ms": ms_per_product(partial(_times_t, dense), x),
                }
            )
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu_quantized_rows.json")
    args = parser.parse_args()
    reason = qr.check(quantized(512, 512, 0))
    if reason is not None:
        raise SystemExit(f"the kernel does not run here: {reason}")
    device = device_name()
    agree, times = agreement(), timings()
    table(
        ["device", "N x K", "rows", "kernel vs float32", "mx.quantized_matmul vs float32"],
        [[device, f"{r['n']} x {r['k']}", r["rows"], f"{r['kernel_vs_f32']:.2e}", f"{r['mlx_vs_f32']:.2e}"]
         for r in agree],
    )  # fmt: skip
    table(
        ["device", "N x K", "rows", "K slices", "kernel ms", "mx.quantized_matmul ms", "bf16 cuBLAS ms"],
        [[device, f"{r['n']} x {r['k']}", r["rows"], r["slices"], f"{r['kernel_ms']:.3f}",
          f"{r['mlx_4bit_ms']:.3f}", f"{r['bf16_ms']:.3f}"] for r in times],
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "agreement": agree, "timings": times}, indent=2))


if __name__ == "__main__":
    main()
