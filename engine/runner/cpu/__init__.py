"""Fast paths for MLX's CPU backend only; each one is picked, or refused with a reason, by
engine/runner/backends.py.
"""
