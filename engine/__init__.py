"""The inference engine, usable with no Ray at all.

Importing this package loads OpenBLAS before MLX so that every process running the model gets
fast CPU matmul (see engine/blas.py). Import `engine` before anything that imports `mlx.core`.
"""

from engine.blas import load_fast_blas

load_fast_blas()
