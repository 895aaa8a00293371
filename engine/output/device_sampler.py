"""Batched sampling on the MLX device: logits in, lazy (B,) token ids and lazy logprobs out; nothing of
vocabulary width is read back, so on a GPU a sampled step pipelines like a greedy one.

Owns the device-side math of one step; never touches request state, the KV cache or the model. Same
semantics and order as engine/output/sampler.py (the structured-output mask, raw logprobs, logit_bias,
min_tokens, penalties, then argmax or temperature, top_k, top_p, min_p and an inverse-CDF draw), written
only in MLX ops so it runs on any device. The host `Sampler.uniforms` supplies one uniform per row, so a
seeded row's token depends on neither the path nor the batch. Filters and the draw: device_filters.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.request import Request
from engine.messages import TokenLogprob
from engine.output.device_filters import choose_tokens, take_rows, top_n
from engine.output.draw_kernel import Draw, applies, row_params
from engine.output.sampler import (
    _F32_MAX,
    GREEDY_TEMPERATURE,
    LOGPROB_FLOOR,
    SampleResult,
    SamplingRow,
    _flat_token_counts,
    _has_penalty,
    _min_tokens_mask,
    _needs_edit,
)

import mlx.core as mx
import numpy as np

_NEG_INF = float("-inf")


@dataclass
class DeviceLogprobs:
    """Lazy logprobs of the rows that asked for them: small arrays, read after evaluation."""

    rows: list[int]  # batch rows that asked, in the order of the arrays
    num_top: list[int]  # top logprobs each asked for (at most the arrays' width)
    chosen: mx.array  # (len(rows),) float32: the sampled token's
    top_ids: mx.array  # (len(rows), max(num_top)) int32, best first, ties by ascending id
    top_logprobs: mx.array  # the same shape, float32; LOGPROB_FLOOR where a grammar masked

    def arrays(self) -> list[mx.array]:
        return [self.chosen, self.top_ids, self.top_logprobs]

    def read(self, token_ids: list[int]) -> dict[int, TokenLogprob]:
        """Each asking row's TokenLogprob, keyed by batch row; `token_ids` are the batch's, read."""
        chosen: list[float] = self.chosen.tolist()  # type: ignore[assignment]
        ids: list[list[int]] = self.top_ids.tolist()  # type: ignore[assignment]
        values: list[list[float]] = self.top_logprobs.tolist()  # type: ignore[assignment]
        out = {}
        for j, (row, k) in enumerate(zip(self.rows, self.num_top)):
            out[row] = TokenLogprob(token_ids[row], chosen[j], list(zip(ids[j][:k], values[j][:k])))
        return out


@dataclass
class DeviceSample:
    token_ids: mx.array  # (B,) int32, lazy
    logprobs: DeviceLogprobs | None  # None: no row asked

    def arrays(self) -> list[mx.array]:
        return [self.token_ids] + (self.logprobs.arrays() if self.logprobs is not None else [])

    def read(self) -> SampleResult:
        """Evaluates and reads: the same types as `Sampler.sample` returns."""
        mx.eval(*self.arrays())
        token_ids: list[int] = self.token_ids.tolist()  # type: ignore[assignment]
        by_row = self.logprobs.read(token_ids) if self.logprobs is not None else {}
        return SampleResult(token_ids, [by_row.get(i) for i in range(len(token_ids))])


def joins_pipeline(request: Request) -> bool:
    """True when the device sampler needs nothing of the request's pending tokens but their number (no
    penalties over its output, no grammar to advance): its token may stay on the device for a step."""
    return request.params.structured is None and not _has_penalty(request.params)


def sample_on_device(
    logits: mx.array, rows: list[SamplingRow], uniforms: np.ndarray, draw: Draw | None = None
) -> DeviceSample:
    """Samples one token per row of (B, vocab) `logits`; `uniforms` (B,) from `Sampler.uniforms(rows)`.
    With `draw` (a checked CUDA kernel, engine/output/draw_kernel.py), a batch that draws any row and
    sets no top_k chooses every row's token in it. Builds the graph only: nothing is evaluated."""
    assert logits.ndim == 2 and logits.shape[0] == len(rows) == len(uniforms), (logits.shape, len(rows))
    raw = _apply_allowed_masks(logits.astype(mx.float32), rows)
    edited = _edit_logits(raw, rows)
    drawing = any(row.params.temperature >= GREEDY_TEMPERATURE for row in rows)
    if draw is not None and drawing and applies(rows, logits.shape[1]):
        token_ids = draw(edited, row_params(rows, uniforms))
    else:
        token_ids = choose_tokens(edited, rows, uniforms)
    return DeviceSample(token_ids, _logprobs(raw, rows, token_ids))


def _apply_allowed_masks(raw: mx.array, rows: list[SamplingRow]) -> mx.array:
    """Each constrained row's disallowed tokens at -inf, the packed bits unpacked on the device."""
    constrained = [i for i, row in enumerate(rows) if row.allowed_token_mask is not None]
    if not constrained:
        return raw
    packed = np.stack([rows[i].allowed_token_mask for i in constrained])  # type: ignore[misc]
    allowed = _unpack_bits(mx.array(np.ascontiguousarray(packed).view(np.uint32)), raw.shape[1])
    if len(constrained) < len(rows):  # unconstrained rows pick a last row that allows everything
        pick = np.full(len(rows), len(constrained), dtype=np.int32)
        pick[constrained] = np.arange(len(constrained))
        allowed = mx.concatenate([allowed, mx.ones((1, raw.shape[1]), dtype=mx.bool_)])[mx.array(pick)]
    return mx.where(allowed, raw, _NEG_INF)


def _unpack_bits(words: mx.array, vocab: int) -> mx.array:
    """(rows, vocab) bool: token t is bit t % 32 of word t // 32; ids past the mask are never allowed."""
    bits = (words[:, :, None] >> mx.arange(32, dtype=mx.uint32)) & 1
    bits = bits.reshape(words.shape[0], -1)
    if bits.shape[1] < vocab:
        bits = mx.pad(bits, [(0, 0), (0, vocab - bits.shape[1])])
    return bits[:, :vocab].astype(mx.bool_)


def _edit_logits(raw: mx.array, rows: list[SamplingRow]) -> mx.array:
    """logit_bias, the min_tokens mask and penalties, as the host's `_edit_logits`: sparse scatters
    into the flat (B * vocab) logits at indices the host builds from the rows."""
    edit = [i for i, row in enumerate(rows) if _needs_edit(row)]
    if not edit:
        return raw
    vocab = raw.shape[1]
    assert len(rows) * vocab < 2**31, "flat indices are int32"
    flat = raw.reshape(-1)
    bias = [(_flat_index(i, t, vocab), b) for i in edit for t, b in rows[i].params.logit_bias.items()]
    if bias:
        index, values = zip(*bias)
        flat = flat.at[mx.array(index, dtype=mx.int32)].add(mx.array(values, dtype=mx.float32))
    masked = [_flat_index(i, t, vocab) for i in edit for t in _min_tokens_mask(rows[i])]
    if masked:
        flat = flat.at[mx.array(masked, dtype=mx.int32)].minimum(mx.array(_NEG_INF))
    out = flat.reshape(raw.shape)
    grammar_first = [i for i in edit if _min_tokens_mask(rows[i]) and rows[i].allowed_token_mask is not None]
    if grammar_first:
        out = _grammar_wins(raw, out, grammar_first)
    if any(_has_penalty(rows[i].params) for i in edit):
        out = _apply_penalties(out, rows)
    return out


def _flat_index(row: int, token_id: int, vocab: int) -> int:
    """Raises for an id outside the vocabulary, as the host's indexing does: a scatter would write into
    the next row instead, and the row fails alone when the engine samples rows apart."""
    if not 0 <= token_id < vocab:
        raise IndexError(f"token id {token_id} is outside the vocabulary [0, {vocab})")
    return row * vocab + token_id


def _grammar_wins(raw: mx.array, edited: mx.array, rows: list[int]) -> mx.array:
    """A constrained row whose grammar allows only EOS or a stop token goes back to its raw logits: the
    grammar wins over min_tokens (the host drops the row's logit_bias too)."""
    flags = np.zeros(raw.shape[0], dtype=bool)
    flags[rows] = True
    revert = mx.array(flags) & mx.all(edited == _NEG_INF, axis=-1)
    return mx.where(revert[:, None], raw, edited)


def _apply_penalties(logits: mx.array, rows: list[SamplingRow]) -> mx.array:
    """vLLM's penalties as the host's `_apply_penalties`: repetition over prompt+output, then frequency
    and presence over output, gathered and scattered at the (row, token) pairs that occur."""
    vocab = logits.shape[1]
    flat = logits.reshape(-1)
    rep = np.array([r.params.repetition_penalty for r in rows]).clip(max=_F32_MAX).astype(np.float32)
    freq = np.array([r.params.frequency_penalty for r in rows], dtype=np.float32)
    presence = np.array([r.params.presence_penalty for r in rows], dtype=np.float32)
    output_rows = [i for i, r in enumerate(rows) if _has_penalty(r.params)]
    assert not any(rows[i].num_pending_outputs for i in output_rows), "penalties need every output read"
    out_ids, out_counts = _flat_token_counts(
        [rows[i].output_token_ids for i in output_rows], output_rows, vocab
    )
    rep_rows = [i for i in output_rows if rep[i] != 1.0]
    if rep_rows:
        prompt_ids, _ = _flat_token_counts([rows[i].prompt_token_ids for i in rep_rows], rep_rows, vocab)
        seen = np.union1d(prompt_ids, out_ids)
        index = mx.array(seen.astype(np.int32))
        penalized = _repetition_penalized(flat[index], mx.array(rep[seen // vocab]))
        flat = mx.put_along_axis(flat, index, penalized, axis=0)
    if out_ids.size:
        row_of = out_ids // vocab
        amounts = (freq[row_of] * out_counts + presence[row_of]).astype(np.float32)
        flat = flat.at[mx.array(out_ids.astype(np.int32))].subtract(mx.array(amounts))
    return flat.reshape(logits.shape)


def _repetition_penalized(values: mx.array, penalty: mx.array) -> mx.array:
    """The host's `_repetition_penalized`: a masked logit stays -inf, an overflow is float32's max."""
    out = mx.where(values > 0, values / penalty, values * penalty)
    out = mx.where(values == _NEG_INF, _NEG_INF, out)
    return mx.nan_to_num(out, nan=0.0, posinf=_F32_MAX, neginf=_NEG_INF)


def _logprobs(raw: mx.array, rows: list[SamplingRow], token_ids: mx.array) -> DeviceLogprobs | None:
    """Log-softmax of the raw (grammar-masked) logits for the sampled token and the top `params.logprobs`."""
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return None
    sub = take_rows(raw, wanted)
    log_total = mx.logsumexp(sub, axis=-1, keepdims=True)
    chosen_ids = take_rows(token_ids, wanted)
    chosen = mx.take_along_axis(sub, chosen_ids[:, None], axis=-1)[:, 0] - log_total[:, 0]
    num_top = [rows[i].params.logprobs or 0 for i in wanted]
    # Log-softmax keeps the order, so the top logprobs are the top logits shifted by log_total.
    top_ids, top_values = top_n(sub, max(num_top))
    top_logprobs = mx.maximum(top_values - log_total, LOGPROB_FLOOR)
    return DeviceLogprobs(wanted, num_top, chosen, top_ids, top_logprobs)
