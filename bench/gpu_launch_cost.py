"""Host cost of one MLX operation on the GPU, by kind: chains of 200 operations of one kind, compiled.

    python bench/gpu_launch_cost.py [--rows 8,64] [--out bench/results/gpu_launch_cost.json]

For each kind (an elementwise add, which compilation fuses; a bf16 matmul through cuBLASLt, as `x @ w`,
`x @ w.T` and `addmm`; `mx.fast.rms_norm`; `mx.fast.cuda_kernel` kernels of one and of three inputs) on
(rows, 2048) bf16 inputs: the host time to build the chain and launch it with `async_eval`, and the
time until it is done, each per operation (medians of 10). Where "host" is near "total" the chain is
bound by MLX's host work per operation, not by the GPU. Prints a table and writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import time
from collections.abc import Callable

import engine  # noqa: F401  # isort: split

import mlx.core as mx

from bench.gpu import device_name, table

CHAIN = 200
WIDTH = 2048
_COPY = "unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < NN) out[i] = x[i];"
_MIX = "unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < NN) out[i] = x[i] + y[i % 2048] + z[i % 2048];"


def per_op_us(op: Callable[[mx.array], mx.array], x0: mx.array) -> tuple[float, float]:
    """(host us, total us) per operation of a compiled chain of CHAIN `op`s."""

    def chain(x: mx.array) -> mx.array:
        for _ in range(CHAIN):
            x = op(x)
        return x

    compiled = mx.compile(chain)
    for _ in range(3):
        mx.eval(compiled(x0))
    host, total = [], []
    for _ in range(10):
        mx.synchronize()
        start = time.perf_counter()
        y = compiled(x0)
        mx.async_eval(y)
        launched = time.perf_counter()
        mx.eval(y)
        host.append(launched - start)
        total.append(time.perf_counter() - start)
    return sorted(host)[5] / CHAIN * 1e6, sorted(total)[5] / CHAIN * 1e6


def kinds(rows: int) -> dict[str, Callable[[mx.array], mx.array]]:
    w = (mx.random.normal((WIDTH, WIDTH)) * 0.02).astype(mx.bfloat16)
    g = mx.ones((WIDTH,), mx.bfloat16)
    copy = mx.fast.cuda_kernel(name="launch_copy", input_names=["x"], output_names=["out"], source=_COPY)
    mix = mx.fast.cuda_kernel(
        name="launch_mix", input_names=["x", "y", "z"], output_names=["out"], source=_MIX
    )
    size = rows * WIDTH

    def custom(kernel, inputs):
        return kernel(
            inputs=inputs, template=[("NN", size)], grid=(size, 1, 1), threadgroup=(256, 1, 1),
            output_shapes=[(rows, WIDTH)], output_dtypes=[mx.bfloat16],
        )[0]  # fmt: skip

    return {
        "add (fused by compile)": lambda x: x + 1,
        "matmul x @ w": lambda x: x @ w,
        "matmul x @ w.T": lambda x: x @ w.T,
        "addmm": lambda x: mx.addmm(x, x, w.T),
        "fast.rms_norm": lambda x: mx.fast.rms_norm(x, g, 1e-5),
        "cuda_kernel, 1 input": lambda x: custom(copy, [x]),
        "cuda_kernel, 3 inputs": lambda x: custom(mix, [x, g, g]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="8,64")
    parser.add_argument("--out", default="bench/results/gpu_launch_cost.json")
    args = parser.parse_args()
    if not mx.cuda.is_available():
        raise SystemExit("needs MLX's CUDA backend")
    device, results = device_name(), []
    for rows in [int(r) for r in args.rows.split(",")]:
        x0 = mx.random.normal((rows, WIDTH)).astype(mx.bfloat16)
        for name, op in kinds(rows).items():
            host, total = per_op_us(op, x0)
            results.append({"rows": rows, "kind": name, "host_us": host, "total_us": total})
            print(f"rows {rows} {name}: host {host:.2f} us, total {total:.2f} us", flush=True)
    table(
        ["device", "rows", "operation", "host us per operation", "total us per operation"],
        [[device, r["rows"], r["kind"], f"{r['host_us']:.2f}", f"{r['total_us']:.2f}"] for r in results],
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "rows": results}, indent=2))


if __name__ == "__main__":
    main()
