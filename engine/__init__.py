"""The inference engine, usable with no Ray at all.

Importing this package loads OpenBLAS before MLX so that every process running the model gets
fast CPU matmul (see engine/platform/blas.py), and keeps glibc from unmapping MLX's large CPU buffers after
each op (engine/platform/allocator.py), and sets MLX's CUDA backend up for a long-running server
(engine/platform/cuda_env.py). Import `engine` before anything that imports `mlx.core`.
"""

from engine.platform.allocator import keep_heap
from engine.platform.blas import load_fast_blas
from engine.platform.cuda_env import set_cuda_defaults

set_cuda_defaults()
load_fast_blas()
keep_heap()
