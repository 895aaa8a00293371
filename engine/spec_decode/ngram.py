"""The n-gram drafter (prompt lookup): the tokens that followed the latest earlier occurrence of the
sequence's own suffix. No model, no state; wins where the output repeats the prompt (code edits, RAG).

Owns the lookup only; which requests draft and how many tokens is engine/spec_decode/speculator.py's.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: list[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_tokens` tokens after the latest earlier match of the last n tokens, the longest n in
    [min_n, max_n] that matches first; [] when none does."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        # Windows of the tokens before the last one: the suffix itself is never its own match.
        windows = sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + num_tokens].tolist()
    return []
