"""The stress run's workload (bench/stress.py): what requests to send, and what each must end as.

Owns the seeded draws and the per-request expectations; never steps the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.messages import GenerateRequest, SamplingParams

import numpy as np

MIN_PROMPT_LEN, MAX_OUTPUT_LEN = 16, 200


@dataclass
class Tracked:
    """What the bench expects of one request and what it has seen of it."""

    max_tokens: int
    abort_after: int | None  # abort once this many tokens arrived; None: never
    wants_logprobs: bool
    num_tokens: int = 0
    num_logprobs: int = 0
    num_bad_logprobs: int = 0  # entries whose top list is not 5 long
    abort_sent: bool = False
    finish_reason: str | None = None
    error: str | None = None


class Workload:
    """Draws requests and the target concurrency from one seeded generator."""

    def __init__(self, seed: int, vocab_size: int, max_prompt_len: int, max_concurrency: int):
        self.rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.max_prompt_len = max_prompt_len
        self.max_concurrency = max_concurrency
        self.num_made = 0
        self.target = 1

    def redraw(self) -> None:
        self.target = int(self.rng.integers(1, self.max_concurrency + 1))

    def request(self) -> tuple[GenerateRequest, Tracked]:
        rng = self.rng
        log_len = rng.uniform(math.log(MIN_PROMPT_LEN), math.log(self.max_prompt_len))
        prompt = rng.integers(2, self.vocab_size, round(math.exp(log_len))).tolist()
        max_tokens = int(rng.integers(1, MAX_OUTPUT_LEN + 1))
        sampled, logprobs = rng.random() < 0.2, rng.random() < 0.05
        aborted = rng.random() < 0.02
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.8 if sampled else 0.0,
            top_p=0.95 if sampled else 1.0,
            seed=int(rng.integers(1 << 31)) if sampled else None,
            ignore_eos=True,
            logprobs=5 if logprobs else None,
        )
        self.num_made += 1
        abort_after = int(rng.integers(0, max_tokens)) if aborted else None
        tracked = Tracked(max_tokens, abort_after, logprobs)
        return GenerateRequest(f"s{self.num_made}", prompt, params), tracked


def request_failures(t: Tracked) -> list[str]:
    """The checks one finished request fails, by kind; none when it ended as expected."""
    kinds = []
    if t.finish_reason == "error" or t.error:
        kinds.append("finished with an error")
    elif t.abort_sent and (t.finish_reason != "abort" or t.num_tokens >= t.max_tokens):
        kinds.append("aborted but did not end aborted")
    elif not t.abort_sent and (t.finish_reason != "length" or t.num_tokens != t.max_tokens):
        kinds.append("not max_tokens tokens with finish_reason length")
    if t.wants_logprobs and (t.num_logprobs != t.num_tokens or t.num_bad_logprobs):
        kinds.append("logprobs missing or not top-5")
    return kinds
