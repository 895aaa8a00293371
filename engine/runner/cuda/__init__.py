"""Fast paths for MLX's CUDA backend only; each one is picked, or refused with a reason, by
engine/runner/backends.py.
"""
