"""Speculative decoding in the batched step: which requests draft, their drafts, their verification and
the acceptance counters.

Owns each request's drafts between proposal and verification (`Request.spec_token_ids`) and the RNG of
the acceptance tests. Never schedules and never runs the model: the scheduler verifies a row's drafts with
its decode token under the step's token budget, the model runner returns logits at every drafted
position, and the engine commits what `verify` keeps.

    per step    propose (before schedule)   n-gram: the drafts; draft model: k placeholder slots, so
                                            schedule allocates the blocks its drafts will use
                fill (after schedule)       draft model: runs over the scheduled rows, fills the drafts
                verify (after the forward)  the tokens each row emits: accepted drafts + one more

A request drafts only when drafting cannot change what it relies on: no grammar (its mask would need
every draft checked first), not one of n > 1 samples, no logprobs. The others decode plainly in the
same batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import SpeculativeConfig
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.output.distribution import edited_logits
from engine.output.sampler import SamplingRow, _seeded_uniform
from engine.spec_decode.draft_model import DraftModel
from engine.spec_decode.ngram import propose_ngram
from engine.spec_decode.rejection import Drafts, verify

import mlx.core as mx
import numpy as np

_ACCEPT_SALT = 0x5DEECE66D  # a seeded row's acceptance uniforms: another SplitMix64 stream than its draws
_PLACEHOLDER = 0  # a draft model's slot before it is filled: any valid token id


@dataclass
class SpecStats:
    """Totals since start, as vLLM's vllm:spec_decode_* counters."""

    num_drafts: int = 0  # verified rows that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: rows whose draft i was accepted


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        max_model_len: int,
        eos_token_ids: set[int],
        draft: DraftModel | None = None,
        seed: int | None = None,
    ):
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.draft = draft
        self._rng = np.random.default_rng(seed)
        self.stats = SpecStats(accepted_per_pos=[0] * config.num_speculative_tokens)
        self._drafts: dict[str, Drafts] = {}  # a draft model's distributions, by request id

    @staticmethod
    def can_draft(request: Request) -> bool:
        p = request.params
        return p.structured is None and request.parent_id is None and p.logprobs is None

    def propose(self, running: list[Request]) -> None:
        """Drafts (n-gram) or reserves draft slots (draft model) for each decoding request that may draft."""
        limit = self.config.disable_by_batch_size
        if limit is not None and len(running) >= limit:
            for request in running:  # drafts made for a smaller batch would be verified in this big one
                request.spec_token_ids.clear()
            return
        for request in running:
            num = self._num_to_draft(request)
            if num <= 0 or request.spec_token_ids:
                continue
            if self.draft is not None:
                request.spec_token_ids = [_PLACEHOLDER] * num
            else:
                c = self.config
                request.spec_token_ids = propose_ngram(
                    request.all_token_ids, num, c.prompt_lookup_min, c.prompt_lookup_max
                )

    def _num_to_draft(self, request: Request) -> int:
        """Drafts that fit: a decoding request with its last token known, within max_tokens and the context."""
        decoding = request.num_computed_tokens == request.num_tokens - 1 >= request.num_prompt_tokens
        if not decoding or request.num_pending_tokens or not self.can_draft(request):
            return 0
        room = min(
            request.max_tokens - request.num_output_tokens - 1, self.max_model_len - request.num_tokens
        )
        return min(self.config.num_speculative_tokens, room)

    def fill(self, scheduled: list[ScheduledRequest]) -> None:
        """A draft model's drafts for the scheduled rows with slots; drafts not scheduled are dropped."""
        if self.draft is None:
            return
        # Distributions live from this step's fill to its verify: a row aborted or failed in between
        # leaves nothing behind.
        self._drafts = {}
        items = [s for s in scheduled if s.num_spec_tokens]
        rows = [_rows(s.request, [], self.eos_token_ids)[0] for s in items]
        for item, drafts in zip(items, self.draft.propose(items, rows, self._uniforms)):
            item.request.spec_token_ids[:] = drafts.token_ids
            self._drafts[item.request.request_id] = drafts

    def verify(self, item: ScheduledRequest, logits: mx.array) -> list[int]:
        """The tokens `item`'s row emits; updates the counters and the draft model's frontier."""
        request = item.request
        spec = list(request.spec_token_ids)
        drafts = self._drafts.pop(request.request_id, None) or Drafts(spec)
        rows = _rows(request, spec, self.eos_token_ids)
        raw = np.asarray(logits)
        accept_u, draw_u = self._uniforms(rows[:-1], _ACCEPT_SALT), self._uniforms(rows)
        tokens = verify(edited_logits(raw, rows), rows, drafts, accept_u, draw_u)
        num_accepted = len(tokens) - 1
        self._count(len(spec), num_accepted)
        if self.draft is not None:  # its cache holds the drafts it was fed: up to the last accepted one
            known = request.num_known_tokens
            request.draft_frontier = min(request.draft_frontier, known + num_accepted)
        return tokens

    def _count(self, num_drafted: int, num_accepted: int) -> None:
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += num_drafted
        stats.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            stats.accepted_per_pos[i] += 1

    def _uniforms(self, rows: list[SamplingRow], salt: int = 0) -> np.ndarray:
        """One uniform per row: a seeded row's is a pure function of (seed, output position)."""
        out = self._rng.random(len(rows))
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                out[i] = _seeded_uniform(row.params.seed ^ salt, row.num_output_tokens)
        return out


def _rows(request: Request, drafts: list[int], eos_token_ids: set[int]) -> list[SamplingRow]:
    """One sampling row per drafted position and one past them: row j as if drafts[:j] were accepted,
    so penalties and min_tokens see the history that token would have."""
    outputs = request.output_token_ids
    return [
        SamplingRow(request.params, request.prompt_token_ids, outputs + drafts[:j], eos_token_ids)
        for j in range(len(drafts) + 1)
    ]
