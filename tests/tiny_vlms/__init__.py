"""Tiny random-weight vision-language models of every mlx-vlm architecture, built with mlx-vlm's own
classes as model directories (config, weights, tokenizer, processor files, chat template).

Each family module exposes `BUILDERS: dict[model_type, (out_dir, seed) -> out_dir]`; `common`, `parts`
(config pieces) and `weights` (edits of the saved weights) hold what they share, `reference` runs
mlx-vlm's own generation for the conformance suite.
"""
