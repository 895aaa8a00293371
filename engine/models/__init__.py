"""Finding and loading models: mlx-lm and mlx-vlm checkpoints, the bundled default built from its GGUF."""
