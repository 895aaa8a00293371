"""Runs the model for one scheduler plan and returns the logits of the requests that sample.

Owns the model and the paged KV storage; receives block tables, never the block pool.
Decode rows (one new token each) run as one batch; each prefill chunk runs as its own row,
so no row is ever padded. Nothing here waits for the device: the logits come back lazy, and a
decode row whose input token is still pending takes it from the previous step's device tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from engine.core.scheduler import ScheduledRequest, SchedulerPlan
from engine.messages import ComputePaths
from engine.models.vision_inputs import model_inputs
from engine.output.sampler import samples_on_device
from engine.runner.backends import Choice
from engine.runner.fast_path import ChunkPath
from engine.runner.layer_caches import LayerCaches
from engine.runner.paged_attention import StepLayout
from engine.runner.state_storage import StateRows, StateStorage

import mlx.core as mx

if TYPE_CHECKING:
    from engine.output.device_sampler import DeviceLogprobs

# Paired prefill chunks are at least this close in length (engine/runner/cpu/paired_prefill.py).
MIN_PAIR_RATIO = 0.5


@dataclass
class StepLogits:
    items: list[ScheduledRequest]  # the items that sample, in row order of `logits`
    logits: mx.array  # (len(items), vocab) float32, lazy
    # Decode rows with drafts to verify (engine/spec_decode/), and for each its logits at every new
    # position, (num_new_tokens, vocab) float32, lazy. Not in `items`.
    spec_items: list[ScheduledRequest] = field(default_factory=list)
    spec_logits: list[mx.array] = field(default_factory=list)
    # The items' tokens, chosen by the forward itself where every item samples plain greedy (the CPU's
    # C forward screens its head: engine/runner/cpu/cpu_greedy.h); `logits` is then (len(items), 0).
    token_ids: list[int] | None = None


@dataclass
class DeviceTokens:
    """Tokens a launched step sampled on the device and nobody has read yet."""

    items: list[ScheduledRequest]
    token_ids: mx.array  # (num_rows,) int32, lazy; rows of requests read at once may be among them
    item_rows: list[int] | None = None  # items[i]'s row of token_ids; None: row i
    logprobs: DeviceLogprobs | None = None  # lazy, of the rows that asked (engine/output/device_sampler.py)

    def __post_init__(self) -> None:
        rows = self.item_rows if self.item_rows is not None else range(len(self.items))
        self.rows = {item.request.request_id: row for item, row in zip(self.items, rows)}


class ModelRunner:
    def __init__(self, choice: Choice, layers: LayerCaches, states: StateStorage | None = None):
        """`choice`: the model, its storage and the paths engine/runner/backends.py picked for them;
        `layers`: the model's cache kinds; `states`: the state slots of its recurrent layers, if any."""
        target = choice.target
        self.model = target.model
        self.storage = target.storage
        self.layers = layers
        self.states = states
        self.block_size = target.storage.block_size
        self.choice = choice
        # Decode rows as one fast call (the CUDA graph, the CPU's C forward), or None: the model's call.
        self.decode = choice.decode
        self.attention = choice.attention  # handed to every step's paged caches
        # A prefill chunk needs logits for its last token only (engine/runner/model_head.py); None: the
        # model's own call computes them for every token. None for VLMs too (no `model` backbone),
        # whose prefill needs the extra inputs of `model_inputs`.
        self.head = target.head
        self.paired = choice.paired  # two prefill chunks at once, or None: one at a time

    def compute_paths(self) -> ComputePaths:
        """Which paths this runner took, for the status endpoint and the load log."""
        return self.choice.compute_paths(str(self.storage.dtype).removeprefix("mlx.core."))

    def execute(self, plan: SchedulerPlan, pending: DeviceTokens | None = None) -> StepLogits:
        decode = [s for s in plan.scheduled if s.num_new_tokens == 1]
        spec = [s for s in plan.scheduled if s.num_spec_tokens]
        prefill = [s for s in plan.scheduled if s.num_new_tokens > 1 and not s.num_spec_tokens]
        items: list[ScheduledRequest] = []
        rows: list[mx.array] = []
        if (
            getattr(self.decode, "serves_chunks", False)
            and (decode or prefill)
            and all(s.start < s.request.num_known_tokens for s in decode)  # else async: on the device
        ):
            # One call for every decode row and prefill chunk (the CPU's C forward).
            items, logits, token_ids = self._forward_rows(decode + prefill)
            if token_ids is not None:
                return StepLogits(items, mx.zeros((len(items), 0)), spec, self._forward_spec(spec), token_ids)
            rows, decode, prefill = [logits], [], []
        # Chunks of similar length two by two (a short partner would leave the long chunk alone
        # on one BLAS thread, slower than two); the rest one by one.
        pairs, singles = pair_chunks(prefill) if self.paired is not None else ([], prefill)
        for pair in pairs:  # before anything else is launched: it changes the BLAS thread count
            for item, logits in zip(pair, self._forward_pair(pair)):
                if item.needs_sample:
                    items.append(item)
                    rows.append(logits[:, -1, :])
        if decode:
            logits = self._forward_decode(decode, self._decode_inputs(decode, pending))
            keep = [i for i, s in enumerate(decode) if s.needs_sample]
            items += [decode[i] for i in keep]
            if keep:  # mx.array([]) is float32, and a float index array fails the whole step
                rows.append(logits if len(keep) == len(decode) else logits[mx.array(keep, dtype=mx.int32)])
        for item in singles:
            logits = self._forward([item], item.num_new_tokens, self._chunk_tokens(item))
            if item.needs_sample:
                items.append(item)
                rows.append(logits[:, -1, :])
        spec_logits = self._forward_spec(spec)
        logits = mx.concatenate(rows).astype(mx.float32) if rows else mx.zeros((0, 1))
        return StepLogits(items, logits, spec, spec_logits)

    def _forward_rows(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[list[ScheduledRequest], mx.array, list[int] | None]:
        """Decode rows and prefill chunks as rows of one decode-path call: a chunk's tokens are rows of
        one sequence at consecutive positions. Logits of the rows that sample: a decode row, a chunk's
        last token; or, where all of them sample plain greedy and the path chooses their tokens itself
        (`step_greedy`), those tokens."""
        path = cast(ChunkPath, self.decode)
        tokens: list[int] = []
        starts: list[int] = []
        tables: list[list[int]] = []
        sampled: list[ScheduledRequest] = []
        logit_rows: list[int] = []
        for item in scheduled:
            end = item.start + item.num_new_tokens
            ids = item.request.all_token_ids[item.start : end]
            assert len(ids) == item.num_new_tokens, "a row's input tokens are known: no async steps here"
            table = item.request.block_ids[: -(-end // self.block_size)]
            tokens += ids
            starts += range(item.start, end)
            tables += [table] * item.num_new_tokens
            if item.needs_sample:
                sampled.append(item)
                logit_rows.append(len(tokens) - 1)
        if not sampled:  # chunks that do not end their prompt: K/V only, one row's logits discarded
            logit_rows = [0]
        inputs = mx.array(tokens, dtype=mx.int32)
        greedy = getattr(path, "step_greedy", None)
        # Before the scheduler's advance, samples_on_device counts one output fewer toward min_tokens:
        # it says plain greedy only where the engine's own check would.
        if greedy is not None and sampled and all(samples_on_device(s.request) for s in sampled):
            token_ids = greedy(inputs, starts, tables, logit_rows)
            if token_ids is not None:
                return sampled, mx.zeros((len(sampled), 0)), token_ids
        logits = path.step(inputs, starts, tables, logit_rows)
        return sampled, logits if sampled else logits[:0], None

    def _forward_spec(self, spec: list[ScheduledRequest]) -> list[mx.array]:
        """Logits at every position of each row with drafts: rows of one length run as one forward
        (one per row where the model cannot batch)."""
        if spec and getattr(self.decode, "rows_share_sequences", False):
            return self._decode_spec(spec)
        out: dict[int, mx.array] = {}
        by_len: dict[int, list[int]] = {}
        for i, item in enumerate(spec):
            by_len.setdefault(item.num_new_tokens, []).append(i)
        for num_new, members in by_len.items():
            groups = [members] if self.layers.batched_decode else [[i] for i in members]
            for group in groups:
                chunk = [spec[i] for i in group]
                tokens = mx.array([self._spec_tokens(item) for item in chunk], dtype=mx.int32)
                logits = self._forward(chunk, num_new, tokens, all_positions=True).astype(mx.float32)
                out.update({i: logits[j] for j, i in enumerate(group)})
        return [out[i] for i in range(len(spec))]

    def _decode_spec(self, spec: list[ScheduledRequest]) -> list[mx.array]:
        """Rows with drafts through the decode path, one decode row per position: that path writes every
        row's K/V before any row attends, so each position sees the ones before it."""
        assert self.decode is not None
        tokens: list[int] = []
        starts: list[int] = []
        tables: list[list[int]] = []
        for item in spec:
            table = item.request.block_ids[: -(-(item.start + item.num_new_tokens) // self.block_size)]
            tokens += self._spec_tokens(item)
            starts += range(item.start, item.start + item.num_new_tokens)
            tables += [table] * item.num_new_tokens
        logits = self.decode.step(mx.array(tokens, dtype=mx.int32), starts, tables).astype(mx.float32)
        bounds = list(itertools.accumulate(s.num_new_tokens for s in spec))
        return [logits[end - s.num_new_tokens : end] for s, end in zip(spec, bounds)]

    @staticmethod
    def _spec_tokens(item: ScheduledRequest) -> list[int]:
        request = item.request
        ids = request.all_token_ids[item.start :] + request.spec_token_ids
        assert len(ids) == item.num_new_tokens, "a row with drafts has its input token known"
        return ids

    def _forward_pair(self, pair: tuple[ScheduledRequest, ScheduledRequest]) -> list[mx.array]:
        assert self.paired is not None and self.head is not None
        tokens = [self._chunk_tokens(item) for item in pair]
        caches = [self._caches([item], item.num_new_tokens, defer_writes=True) for item in pair]
        mx.synchronize()  # no matmul may run on the default stream while the thread count changes
        hidden = self.paired.hidden(tokens, caches)
        # The pools are written only now, from this thread's stream: two streams writing one pool
        # would each make the other's write copy it.
        for layer_caches in caches:
            for cache in layer_caches:
                cache.write_deferred()
        mx.async_eval(*self.storage.arrays())
        return [self.head(h[:, -1:, :]) for h in hidden]

    @staticmethod
    def _chunk_tokens(item: ScheduledRequest) -> mx.array:
        ids = item.request.all_token_ids[item.start : item.start + item.num_new_tokens]
        assert len(ids) == item.num_new_tokens, "only a decode row's input may be pending"
        return mx.array([ids], dtype=mx.int32)

    def _caches(self, chunk: list[ScheduledRequest], num_new: int, defer_writes: bool = False) -> list:
        tables = [s.request.block_ids[: -(-(s.start + num_new) // self.block_size)] for s in chunk]
        starts = [s.start for s in chunk]
        layout = StepLayout(
            starts, num_new, tables, self.block_size, self.attention, defer_writes, self.layers.mask_ndim
        )
        rows = None
        if self.states is not None:
            slots = [s.request.state_slot for s in chunk]
            assert all(slot is not None for slot in slots), "a request with recurrent layers holds a slot"
            rows = StateRows(slots, [s == 0 for s in starts], self.states.zero_slot)  # type: ignore[arg-type]
        return self.layers.build(self.storage, self.states, layout, rows)

    def _forward_decode(self, decode: list[ScheduledRequest], tokens: mx.array) -> mx.array:
        """(B, vocab) logits of decode rows: one forward, or one per row where the model cannot batch."""
        if self.layers.batched_decode or len(decode) == 1:
            return self._forward(decode, 1, tokens)[:, -1, :]
        rows = [self._forward([item], 1, tokens[i : i + 1]) for i, item in enumerate(decode)]
        return mx.concatenate(rows)[:, -1, :]

    @staticmethod
    def _decode_inputs(decode: list[ScheduledRequest], pending: DeviceTokens | None) -> mx.array:
        """(B, 1) input tokens: known ones from the requests, pending ones from the device."""
        known = [
            s.request.all_token_ids[s.start] if s.start < s.request.num_known_tokens else None for s in decode
        ]
        if all(t is not None for t in known):
            return mx.array(known, dtype=mx.int32)[:, None]
        assert pending is not None, "a pending input token needs the step that sampled it"
        rows = mx.array([pending.rows.get(s.request.request_id, 0) for s in decode], dtype=mx.int32)
        from_device = mx.take(pending.token_ids, rows)
        if all(t is None for t in known):
            return from_device[:, None]
        is_known = mx.array([t is not None for t in known])
        return mx.where(is_known, mx.array([t or 0 for t in known], dtype=mx.int32), from_device)[:, None]

    def _forward(
        self, chunk: list[ScheduledRequest], num_new: int, tokens: mx.array, all_positions: bool = False
    ) -> mx.array:
        """(B, num_new, vocab) logits; a prefill chunk's only at its last position unless `all_positions`."""
        states: list[mx.array] = []
        if num_new == 1 and self.decode is not None:
            tables = [s.request.block_ids[: -(-(s.start + 1) // self.block_size)] for s in chunk]
            logits = self.decode.step(tokens[:, 0], [s.start for s in chunk], tables)[:, None, :]
        else:
            caches = self._caches(chunk, num_new)
            if num_new > 1 and self.head is not None and not all_positions:
                hidden = self.model.model(tokens, cache=caches)
                logits = self.head(hidden[:, -1:, :])
            else:
                logits = self.model(tokens, cache=caches, **model_inputs(self.model, chunk, tokens))
            states = self.layers.write_back(caches)
        # Launch each forward at once: the next one's scatter then finds the pools evaluated and
        # updates them in place, and the host goes on building while the device computes.
        to_eval = [logits] if chunk[0].needs_sample or num_new == 1 else []
        states += self.states.arrays() if self.states is not None else []
        mx.async_eval(*to_eval, *self.storage.arrays(), *states)
        return logits


def pair_chunks(
    prefill: list[ScheduledRequest],
) -> tuple[list[tuple[ScheduledRequest, ScheduledRequest]], list[ScheduledRequest]]:
    """Longest first, each chunk with the next longest when within MIN_PAIR_RATIO of its length;
    (pairs, the chunks left over)."""
    left = sorted(prefill, key=lambda s: -s.num_new_tokens)
    pairs, singles = [], []
    while left:
        first = left.pop(0)
        if left and left[0].num_new_tokens >= MIN_PAIR_RATIO * first.num_new_tokens:
            pairs.append((first, left.pop(0)))
        else:
            singles.append(first)
    return pairs, singles
