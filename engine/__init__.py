"""The inference engine, usable with no Ray at all.

Importing this package loads OpenBLAS before MLX so that every process running the model gets
fast CPU matmul (see engine/platform/blas.py), and keeps glibc from unmapping MLX's large CPU buffers after
each op (engine/platform/allocator.py), and keeps MLX's CUDA graph cache from aborting a long-running
process (engine/platform/cuda_graphs.py). Import `engine` before anything that imports `mlx.core`.
"""

from engine.platform.allocator import keep_heap
from engine.platform.blas import load_fast_blas
from engine.platform.cuda_graphs import bound_graph_cache

bound_graph_cache()
load_fast_blas()
keep_heap()
