"""The project's tensor-core kernel compiled with NVRTC on a machine without a GPU: registers, spilled bytes
and the main loop's instruction count at each tiling a decode uses. Device time is scarce; this says
before a GPU run whether a change altered the code the GPU would run, and whether it spills.

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
    python bench/cuda_ptx.py [--arch sm_90] [--out bench/results/cuda_ptx.json]

The main loop is counted as the PTX instructions from 400 before the first `mma.sync` to 50 after the
last (the prefetch, the dequantization and the tensor-core steps of one chunk). Prints a table and
writes JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import ctypes
import importlib.util
import json
import re

import engine  # noqa: F401  # isort: split
from engine.runner.cuda import quantized_rows, rows_mma

from bench.gpu import table

ROWS = (2, 8, 32, 33, 64, 128)
SIGNATURE = (
    "const __nv_bfloat16* x, const unsigned int* w, const __nv_bfloat16* scales, const __nv_bfloat16* biases, "
    "const unsigned int* counters, float* part, __nv_bfloat16* out, "
    "const int* x_shape, const int* w_shape, const int* scales_shape"
)


def nvidia_dir() -> Path:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs: pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12")
    return Path(next(iter(spec.submodule_search_locations)))


def compile_ptx(nvrtc: ctypes.CDLL, include: Path, source: str, options: list[str]) -> tuple[str, str]:
    """(PTX, log) of `source`; raises with the log where it does not compile."""
    program = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"k.cu", 0, None, None) == 0
    opts = [*options, f"-I{include}", "--std=c++17", "-default-device"]
    rc = nvrtc.nvrtcCompileProgram(
        program, len(opts), (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
    )
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    if rc != 0:
        raise RuntimeError(log.value.decode())
    nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(program, ptx)
    return ptx.value.decode(), log.value.decode()


def main_loop_size(ptx: str) -> int:
    lines = [line.strip() for line in ptx.splitlines()]
    mma = [i for i, line in enumerate(lines) if line.startswith("mma.sync")]
    window = lines[max(0, mma[0] - 400) : mma[-1] + 50]
    return sum(1 for line in window if line and not line.startswith(("//", "$", "{", "}", ".")))


def instance(rows: int, slices: int) -> dict:
    mt, nt = rows_mma.tiles(rows)
    reduce = int(rows_mma.adds_own_slices(rows, slices))
    return {"rows": rows, "MT": mt, "NT": nt, "REDUCE": reduce, "JS": quantized_rows.CHUNK // 32, "GS": 64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--out", default="bench/results/cuda_ptx.json")
    args = parser.parse_args()
    nvidia = nvidia_dir()
    nvrtc = ctypes.CDLL(str(next((nvidia / "cuda_nvrtc" / "lib").glob("libnvrtc.so*"))))
    include = nvidia / "cuda_runtime" / "include"
    results = []
    for rows in ROWS:
        params = instance(rows, slices=2)
        names = ("MT", "NT", "REDUCE", "JS", "GS")
        source = (
            "#include <cuda_bf16.h>\n"
            f"template <{', '.join(f'int {n}' for n in names)}>\n"
            f"__global__ void kernel({SIGNATURE}) {{\n{quantized_rows._SOURCE}\n}}\n"
            f"template __global__ void kernel<{', '.join(str(params[n]) for n in names)}>({SIGNATURE});\n"
        )
        ptx, _ = compile_ptx(nvrtc, include, source, [f"--gpu-architecture=compute_{args.arch[3:]}"])
        _, log = compile_ptx(
            nvrtc, include, source, [f"--gpu-architecture={args.arch}", "--ptxas-options=-v"]
        )
        registers = re.search(r"Used (\d+) registers", log)
        spills = re.search(r"(\d+) bytes spill stores", log)
        params |= {
            "registers": int(registers.group(1)) if registers else None,
            "spill_store_bytes": int(spills.group(1)) if spills else None,
            "main_loop_instructions": main_loop_size(ptx),
        }
        results.append(params)
    table(
        ["rows", "MT x NT", "kernel adds its slices", "registers", "spilled bytes", "main-loop PTX instructions"],
        [[r["rows"], f"{r['MT']} x {r['NT']}", bool(r["REDUCE"]), r["registers"], r["spill_store_bytes"],
          r["main_loop_instructions"]] for r in results],
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"arch": args.arch, "kernel": "quantized_rows", "instances": results}, indent=2)
    )


if __name__ == "__main__":
    main()
