"""The few-row kernels (engine/runner/cuda/quantized_rows.py, bf16_rows.py) alone on a GPU: agreement and
time per product.

    python bench/gpu_rows_kernels.py [--out bench/results/gpu_rows_kernels.json]

For Llama-3.2-1B's and Llama-3.1-8B's projection shapes (random bf16 weights, and the same quantized as
mlx-lm does: affine, 4 bits, groups of 64): the largest difference of each kernel and of MLX's own
product (`mx.quantized_matmul`, cuBLAS) from a float32 product over the same weights, as a share of its
largest output, at 2 to 128 rows, and whether a second call gives the same bits (the k-split's counters
reset, its sum in a fixed order); then ms per product of each, 50 products evaluated together. Those
times include MLX's host cost per product where it exceeds the GPU's; the engine's decode (bench/gpu.py,
`--baseline cuda_bf16_rows=false`) is the measure that counts. Prints tables and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import time

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import bf16_rows, quantized_rows
from engine.runner.cuda.small_matmul import SmallRowsLinear

import mlx.core as mx
from mlx import nn

from bench.gpu import device_name, table

AGREE_SHAPES = [(3072, 2048), (2048, 8192), (6144, 4096)]
AGREE_ROWS = [2, 5, 8, 33, 64, 100, 128]  # row and column tiles part-filled, one or many K slices
TIME_SHAPES = [
    (3072, 2048),
    (16384, 2048),
    (2048, 8192),
    (6144, 4096),
    (128256, 4096),
]
TIME_ROWS = [8, 16, 32, 64]


def layers(n: int, k: int, seed: int) -> tuple[nn.Module, nn.Module, mx.array, mx.array]:
    """(4-bit kernel layer, bf16 kernel layer, the 4-bit layer's dequantized weight, the bf16 weight)."""
    dense = (mx.random.normal((n, k), key=mx.random.key(seed)) * 0.02).astype(mx.bfloat16)
    linear = nn.Linear(k, n, bias=False)
    linear.weight = dense
    q = nn.QuantizedLinear.from_linear(linear, group_size=64, bits=4)
    mx.eval(q.parameters())
    fast_q = quantized_rows.QuantizedRowsLinear(q)
    fast_b = bf16_rows.Bf16RowsLinear(SmallRowsLinear(dense))
    return fast_q, fast_b, mx.dequantize(q.weight, q.scales, q.biases, 64, 4), dense


def _worst(got: mx.array, ref: mx.array) -> float:
    return (mx.abs(got.astype(mx.float32) - ref).max() / mx.abs(ref).max()).item()  # type: ignore[return-value]


def agreement() -> list[dict]:
    rows_out = []
    for n, k in AGREE_SHAPES:
        fast_q, fast_b, wq, wb = layers(n, k, n + k)
        for rows in AGREE_ROWS:
            x = mx.random.normal((rows, k), key=mx.random.key(rows)).astype(mx.bfloat16)
            ref_q = x.astype(mx.float32) @ wq.astype(mx.float32).T
            ref_b = x.astype(mx.float32) @ wb.astype(mx.float32).T
            row = {"n": n, "k": k, "rows": rows}
            row["q4_kernel_vs_f32"] = _worst(got := fast_q(x), ref_q)
            row["q4_mlx_vs_f32"] = _worst(fast_q.inner(x), ref_q)
            row["q4_repeat_equal"] = mx.array_equal(got, fast_q(x)).item()
            if rows >= bf16_rows.MIN_ROWS:
                row["bf16_kernel_vs_f32"] = _worst(got := fast_b(x), ref_b)
                row["bf16_cublas_vs_f32"] = _worst(x @ wb.T, ref_b)
                row["bf16_repeat_equal"] = mx.array_equal(got, fast_b(x)).item()
            rows_out.append(row)
    return rows_out


def ms_per_product(f, x: mx.array, reps: int = 50) -> float:
    for _ in range(3):
        mx.eval(f(x))
    mx.synchronize()
    start = time.perf_counter()
    mx.eval(*[f(x) for _ in range(reps)])
    mx.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def timings() -> list[dict]:
    rows_out = []
    for n, k in TIME_SHAPES:
        fast_q, fast_b, _, wb = layers(n, k, 1)
        for rows in TIME_ROWS:
            x = mx.random.normal((rows, k)).astype(mx.bfloat16)
            mx.eval(x)
            rows_out.append(
                {
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "q4_kernel_ms": ms_per_product(fast_q, x),
                    "q4_mlx_ms": ms_per_product(fast_q.inner, x),
                    "bf16_kernel_ms": ms_per_product(fast_b, x),
                    "bf16_cublas_ms": ms_per_product(lambda v, w=wb: v @ w.T, x),
                }
            )
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu_rows_kernels.json")
    args = parser.parse_args()
    fast_q, fast_b, _, _ = layers(512, 512, 0)
    reason = quantized_rows.check(fast_q.inner) or bf16_rows.check(SmallRowsLinear(fast_b.weight))
    if reason is not None:
        raise SystemExit(f"the kernels do not run here: {reason}")
    device = device_name()
    agree, times = agreement(), timings()
    fmt = lambda r, key: f"{r[key]:.2e}" if key in r else "-"
    table(
        ["device", "N x K", "rows", "4-bit kernel", "mx.quantized_matmul", "same bits twice", "bf16 kernel",
         "cuBLAS bf16", "same bits twice"],
        [[device, f"{r['n']} x {r['k']}", r["rows"], fmt(r, "q4_kernel_vs_f32"), fmt(r, "q4_mlx_vs_f32"),
          r["q4_repeat_equal"], fmt(r, "bf16_kernel_vs_f32"), fmt(r, "bf16_cublas_vs_f32"),
          r.get("bf16_repeat_equal", "-")] for r in agree],
    )  # fmt: skip
    table(
        ["device", "N x K", "rows", "4-bit kernel ms", "mx.quantized_matmul ms", "bf16 kernel ms", "cuBLAS bf16 ms"],
        [[device, f"{r['n']} x {r['k']}", r["rows"], f"{r['q4_kernel_ms']:.3f}", f"{r['q4_mlx_ms']:.3f}",
          f"{r['bf16_kernel_ms']:.3f}", f"{r['bf16_cublas_ms']:.3f}"] for r in times],
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "agreement": agree, "timings": times}, indent=2))


if __name__ == "__main__":
    main()
