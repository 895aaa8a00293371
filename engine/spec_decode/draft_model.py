"""The draft model: a small model with the model's tokenizer, run in the same Scheduler with a paged
cache of its own that shares the model's block tables (one block id, two pools), so it needs no block
bookkeeping of its own and is freed with the request.

Owns the draft's weights, its KV pools and each request's `draft_frontier` (positions of its cache that
hold the request's actual tokens). Per step it first catches up on the tokens it has not seen (the
prompt once, then the tokens the last verification kept), then drafts k tokens one forward at a time,
greedy for greedy requests, else sampled from its own distribution under the request's sampling
parameters (which the rejection test needs, engine/spec_decode/rejection.py).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.scheduler import ScheduledRequest
from engine.models.model_loader import LoadedModel
from engine.output.distribution import edited_logits, probabilities
from engine.output.sampler import GREEDY_TEMPERATURE, SamplingRow
from engine.runner.backends import Choice
from engine.runner.kv_storage import KVStorage
from engine.runner.layer_caches import KvLayer, LayerCaches, _leaves
from engine.runner.paged_attention import StepLayout
from engine.spec_decode.rejection import Drafts

import mlx.core as mx
import numpy as np

Uniforms = Callable[[list[SamplingRow]], np.ndarray]
_CATCH_UP_CHUNK = 512  # tokens per forward while the draft reads a prompt


class DraftModelError(ValueError):
    pass


class DraftModel:
    def __init__(
        self, loaded: LoadedModel, layers: LayerCaches, storage: KVStorage, vocab_size: int, choice: Choice
    ):
        """`vocab_size`: the model's (the draft's logits are padded to it); `choice`: the paths
        engine/runner/backends.py picked for the draft, so its one-token steps take the fast decode."""
        self.model = loaded.model
        self.layers = layers
        self.storage = storage
        self.block_size = storage.block_size
        self.vocab_size = vocab_size
        self.decode = choice.decode
        self.attention = choice.attention

    @staticmethod
    def check(loaded: LoadedModel, layers: LayerCaches, target_vocab: dict[str, int]) -> None:
        """Raises DraftModelError where the draft cannot serve: another tokenizer, or caches the shared
        block tables cannot hold (recurrent state, the model's own caches)."""
        if loaded.tokenizer.get_vocab() != target_vocab:
            raise DraftModelError(
                f"the draft model {loaded.name!r} has another tokenizer than the model; pick a draft "
                "model of the same family"
            )
        if not all(isinstance(k, KvLayer) for k in _leaves(layers.kinds)):
            raise DraftModelError(
                f"the draft model {loaded.name!r} keeps state beside its KV cache ({layers.kinds_summary}); "
                "pick a draft model with attention layers only"
            )

    def propose(
        self, items: list[ScheduledRequest], rows: list[SamplingRow], uniforms: Uniforms
    ) -> list[Drafts]:
        """Drafts for each scheduled row with slots: as many as its `num_spec_tokens`."""
        logits = self._catch_up(items)
        drafts = [Drafts([], None if _greedy(row) else np.zeros((0, self.vocab_size))) for row in rows]
        num_steps = max(s.num_spec_tokens for s in items) if items else 0
        for step in range(num_steps):
            live = [i for i, s in enumerate(items) if step < s.num_spec_tokens]
            tokens = self._pick(
                [logits[i] for i in live], [rows[i] for i in live], [drafts[i] for i in live], uniforms
            )
            for i, token in zip(live, tokens):
                rows[i] = SamplingRow(
                    rows[i].params,
                    rows[i].prompt_token_ids,
                    rows[i].output_token_ids + [token],
                    rows[i].eos_token_ids,
                )
            if step + 1 == num_steps:
                break
            fed = [i for i in live if step + 1 < items[i].num_spec_tokens]
            if not fed:
                break
            out = self._forward([items[i] for i in fed], [[drafts[i].token_ids[-1]] for i in fed], step + 1)
            for j, i in enumerate(fed):
                logits[i] = out[j]
        for item in items:
            request = item.request
            request.draft_frontier = request.num_known_tokens + item.num_spec_tokens - 1
        return drafts

    def _catch_up(self, items: list[ScheduledRequest]) -> list[mx.array]:
        """Feeds each row the tokens its draft cache lacks; returns the logits after its last token."""
        out: list[mx.array | None] = [None] * len(items)
        by_len: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            request = item.request
            by_len.setdefault(request.num_known_tokens - request.draft_frontier, []).append(i)
        for length, members in by_len.items():
            if length <= _CATCH_UP_CHUNK:
                tokens = [items[i].request.all_token_ids[-length:] for i in members]
                logits = self._forward([items[i] for i in members], tokens, 0)
                for j, i in enumerate(members):
                    out[i] = logits[j]
                continue
            for i in members:  # a prompt: in chunks, one row at a time
                request = items[i].request
                while request.draft_frontier < request.num_known_tokens:
                    end = min(request.draft_frontier + _CATCH_UP_CHUNK, request.num_known_tokens)
                    chunk = request.all_token_ids[request.draft_frontier : end]
                    out[i] = self._forward([items[i]], [chunk], 0, start=request.draft_frontier)[0]
                    request.draft_frontier = end
        return out  # type: ignore[return-value]

    def _forward(
        self, items: list[ScheduledRequest], tokens: list[list[int]], ahead: int, start: int | None = None
    ) -> list[mx.array]:
        """Rows of equal length at their positions: after the known tokens plus `ahead` drafts, or at
        `start`. Returns each row's logits after its last token, evaluated."""
        num_new = len(tokens[0])
        starts = [start if start is not None else s.request.num_known_tokens + ahead - num_new for s in items]
        tables = [s.request.block_ids[: -(-(p + num_new) // self.block_size)] for s, p in zip(items, starts)]
        if num_new == 1 and self.decode is not None:
            logits = self.decode.step(mx.array([t[0] for t in tokens], dtype=mx.int32), starts, tables)
        else:
            layout = StepLayout(
                starts, num_new, tables, self.block_size, self.attention, mask_ndim=self.layers.mask_ndim
            )
            caches = self.layers.build(self.storage, None, layout, None)
            logits = self.model(mx.array(tokens, dtype=mx.int32), cache=caches)[:, -1, :]
        logits = logits.astype(mx.float32)
        mx.eval(logits, *self.storage.arrays())
        return [logits[j] for j in range(len(items))]

    def _pick(
        self, logits: list[mx.array], rows: list[SamplingRow], drafts: list[Drafts], uniforms: Uniforms
    ) -> list[int]:
        """Each row's next draft: the argmax for greedy rows, else a draw from the draft's distribution."""
        raw = np.stack([np.asarray(x) for x in logits])
        if raw.shape[1] < self.vocab_size:  # the model's vocabulary may be padded wider
            raw = np.pad(raw, ((0, 0), (0, self.vocab_size - raw.shape[1])), constant_values=-np.inf)
        edited = edited_logits(raw[:, : self.vocab_size], rows)
        tokens = edited.argmax(axis=-1).tolist()
        sampled = [i for i, row in enumerate(rows) if not _greedy(row)]
        if sampled:
            probs = probabilities(edited[sampled], [rows[i] for i in sampled])
            draws = uniforms([rows[i] for i in sampled])
            for j, i in enumerate(sampled):
                cdf = np.cumsum(probs[j])
                tokens[i] = min(int(np.searchsorted(cdf, draws[j] * cdf[-1], side="right")), len(cdf) - 1)
                drafts[i].probs = np.concatenate([drafts[i].probs, probs[j : j + 1]])
        for draft, token in zip(drafts, tokens):
            draft.token_ids.append(int(token))
        return tokens


def _greedy(row: SamplingRow) -> bool:
    return row.params.temperature < GREEDY_TEMPERATURE
