"""Process set-up that must happen before MLX runs: the BLAS library, glibc's allocator settings,
the per-user cache folder.
"""
