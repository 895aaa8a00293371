"""The 4-bit rows kernel (engine/runner/cuda/quantized_rows.py) alone on a GPU: agreement and time per product.

    python bench/gpu_quantized_rows.py [--out bench/results/gpu_quantized_rows.json]

For Llama-3.2-1B's and Llama-3.1-8B's projection shapes (random bf16 weights quantized as mlx-lm does:
affine, 4 bits, groups of 64): the largest difference of the kernel and of `mx.quantized_matmul` from a
float32 product over the same dequantized weights, as a share of its largest output, at 2 to 128 rows,
and whether a second call gives the same bits (the k-split's counters reset, its sum in a fixed order);
then ms per product of the kernel, of `mx.quantized_matmul` and of a bf16 cuBLAS product of the same
shape, each 50 products evaluated together. Those times include MLX's host cost per product where it
exceeds the GPU's; the engine's decode (bench/gpu.py, `--baseline cuda_quantized_rows=false`) is the
measure that counts. Prints tables and writes JSON.
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
from engine.runner.cuda import quantized_rows

import mlx.core as mx
from mlx import nn

from bench.gpu import device_name, table

AGREE_SHAPES = [(3072, 2048), (2048, 8192), (6144, 4096), (4096, 14336)]
AGREE_ROWS = [2, 7, 8, 32, 33, 64, 100, 128]  # row and column tiles part-filled, one or many K slices
TIME_SHAPES = [
    (3072, 2048),
    (16384, 2048),
    (2048, 8192),
    (6144, 4096),
    (128256, 4096),
]
TIME_ROWS = [8, 16, 32, 64]


def layers(n: int, k: int, seed: int) -> tuple[quantized_rows.QuantizedRowsLinear, mx.array, mx.array]:
    """(the kernel's layer, its dequantized weight, the bf16 weight it was quantized from)."""
    dense = (mx.random.normal((n, k), key=mx.random.key(seed)) * 0.02).astype(mx.bfloat16)
    linear = nn.Linear(k, n, bias=False)
    linear.weight = dense
    q = nn.QuantizedLinear.from_linear(linear, group_size=64, bits=4)
    mx.eval(q.parameters())
    return quantized_rows.QuantizedRowsLinear(q), mx.dequantize(q.weight, q.scales, q.biases, 64, 4), dense


def _worst(got: mx.array, ref: mx.array) -> float:
    return (mx.abs(got.astype(mx.float32) - ref).max() / mx.abs(ref).max()).item()  # type: ignore[return-value]


def agreement() -> list[dict]:
    rows_out = []
    for n, k in AGREE_SHAPES:
        fast, weight, _ = layers(n, k, n + k)
        for rows in AGREE_ROWS:
            x = mx.random.normal((rows, k), key=mx.random.key(rows)).astype(mx.bfloat16)
            ref = x.astype(mx.float32) @ weight.astype(mx.float32).T
            got = fast(x)
            rows_out.append(
                {
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "kernel_vs_f32": _worst(got, ref),
                    "mlx_vs_f32": _worst(fast.inner(x), ref),
                    "repeat_equal": mx.array_equal(got, fast(x)).item(),
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


def timings() -> list[dict]:
    rows_out = []
    for n, k in TIME_SHAPES:
        fast, _, dense = layers(n, k, 1)
        for rows in TIME_ROWS:
            x = mx.random.normal((rows, k)).astype(mx.bfloat16)
            mx.eval(x)
            rows_out.append(
                {
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "kernel_ms": ms_per_product(fast, x),
                    "mlx_4bit_ms": ms_per_product(fast.inner, x),
                    "bf16_ms": ms_per_product(lambda v, w=dense: v @ w.T, x),
                }
            )
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu_quantized_rows.json")
    parser.add_argument("--no-timings", action="store_true", help="the agreement table only")
    args = parser.parse_args()
    reason = quantized_rows.check(layers(512, 512, 0)[0].inner)
    if reason is not None:
        raise SystemExit(f"the kernel does not run here: {reason}")
    device = device_name()
    agree = agreement()
    table(
        ["device", "N x K", "rows", "kernel vs float32", "mx.quantized_matmul vs float32", "same bits twice"],
        [[device, f"{r['n']} x {r['k']}", r["rows"], f"{r['kernel_vs_f32']:.2e}", f"{r['mlx_vs_f32']:.2e}",
          r["repeat_equal"]] for r in agree],
    )  # fmt: skip
    times = [] if args.no_timings else timings()
    if times:
        table(
            ["device", "N x K", "rows", "kernel ms", "mx.quantized_matmul ms", "bf16 cuBLAS ms"],
            [[device, f"{r['n']} x {r['k']}", r["rows"], f"{r['kernel_ms']:.3f}", f"{r['mlx_4bit_ms']:.3f}",
              f"{r['bf16_ms']:.3f}"] for r in times],
        )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "agreement": agree, "timings": times}, indent=2))


if __name__ == "__main__":
    main()
