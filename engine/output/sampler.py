"""Batched per-request sampling for one engine step: logits in, one token (and its logprobs) per row out.

Owns the per-step sampling math and the RNG for unseeded rows; it never touches request state, the KV
cache or the model. The math runs in NumPy on a zero-copy view of the MLX logits because on the CPU
backend MLX's exp and log cost ~20-40 ns per element against NumPy's ~0.5 (measured on the 2-core box).

Order of operations, as vLLM: logit_bias, min_tokens mask, repetition / presence / frequency penalties,
then greedy argmax or temperature, top_k, top_p, min_p and a categorical draw. Logprobs are the
log-softmax of the raw model logits (vLLM's default "raw_logprobs"), before any of the above.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from engine.core.request import Request
from engine.errors import InvalidRequestError
from engine.messages import SamplingParams, TokenLogprob

import mlx.core as mx
import numpy as np

GREEDY_TEMPERATURE = 1e-5  # below this a temperature means argmax
MAX_LOGPROBS = 20
LOGPROB_FLOOR = -9999.0  # a masked token's logprob, as vLLM: -inf is not JSON
MAX_STOP_STRINGS = 16
MAX_ABS_LOGIT_BIAS = 100.0
MAX_ABS_PENALTY = 2.0  # presence and frequency, as OpenAI
_MIN_GROUPS = 1024  # strided groups of the top-k bound: more is more selective, and as cheap
_F32_MAX = float(np.finfo(np.float32).max)
_NUCLEUS_WIDTHS = (64, 2048)  # candidate counts tried for top_p before a full sort
_FLAT_DRAW_MAX = 4096  # wider rows are drawn from in two levels of _DRAW_BLOCK
_DRAW_BLOCK = 128
_U64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment


@dataclass
class SamplingRow:
    """What the sampler needs to know about one request for this step's token."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: set[int] = field(default_factory=set)
    # Structured output: packed bits, token t allowed iff bit t % 32 of word t // 32 is set
    # (engine/output/structured_output.py). Ids past the mask's end (model vocab > tokenizer's) are never allowed.
    allowed_token_mask: np.ndarray | None = None
    # Outputs a launched step sampled on the device and nobody read yet (engine/output/device_sampler.py):
    # they count for a seeded row's position and for min_tokens; their ids are unknown, so such a row
    # never has penalties.
    num_pending_outputs: int = 0

    def __post_init__(self) -> None:
        # Counted now: `output_token_ids` may be a request's own list, which grows when a later read
        # commits this row's pending token (then counted twice, as read and as pending).
        self._num_read_outputs = len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return self._num_read_outputs + self.num_pending_outputs


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # None where the row did not ask for logprobs


def validate_params(params: SamplingParams, vocab_size: int) -> None:
    """Raises InvalidRequestError naming the first parameter a request must change to be served."""
    p = params
    _require(_finite(p.temperature) and p.temperature >= 0, "temperature", ">= 0 (0 means greedy)", p)
    _require(_finite(p.top_p) and 0 < p.top_p <= 1, "top_p", "in (0, 1] (1 turns it off)", p)
    _require(p.top_k is None or p.top_k >= 1, "top_k", ">= 1, or null to turn it off", p)
    _require(_finite(p.min_p) and 0 <= p.min_p <= 1, "min_p", "in [0, 1] (0 turns it off)", p)
    _require(_finite(p.repetition_penalty) and p.repetition_penalty > 0, "repetition_penalty", "> 0", p)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        _require(_finite(value) and abs(value) <= MAX_ABS_PENALTY, name, "in [-2, 2]", p)
    for token_id, bias in p.logit_bias.items():
        _require_token(token_id, vocab_size, "logit_bias")
        if not (_finite(bias) and abs(bias) <= MAX_ABS_LOGIT_BIAS):
            raise InvalidRequestError(
                f"logit_bias {bias} for token {token_id} is outside [-100, 100]", "logit_bias"
            )
    _require(p.logprobs is None or 0 <= p.logprobs <= MAX_LOGPROBS, "logprobs", "in [0, 20]", p)
    _require(p.max_tokens is None or p.max_tokens >= 1, "max_tokens", ">= 1", p)
    _require(p.min_tokens >= 0, "min_tokens", ">= 0", p)
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise InvalidRequestError(
            f"min_tokens {p.min_tokens} exceeds max_tokens {p.max_tokens}; lower min_tokens", "min_tokens"
        )
    for token_id in p.stop_token_ids:
        _require_token(token_id, vocab_size, "stop_token_ids")
    if len(p.stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"{len(p.stop)} stop strings given; use at most {MAX_STOP_STRINGS}", "stop")
    if any(not s for s in p.stop):
        raise InvalidRequestError("stop strings must not be empty; remove the empty one", "stop")


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _require(ok: bool, name: str, rule: str, params: SamplingParams) -> None:
    if not ok:
        raise InvalidRequestError(f"{name} must be {rule}; got {getattr(params, name)!r}", name)


def _require_token(token_id: int, vocab_size: int, param: str) -> None:
    if not (isinstance(token_id, int) and 0 <= token_id < vocab_size):
        raise InvalidRequestError(
            f"{param} names token id {token_id!r}, outside this model's vocabulary [0, {vocab_size})", param
        )


class Sampler:
    """Samples one token per row. Stateless across steps except for the RNG of unseeded rows.

    A row with `params.seed` draws its randomness from a generator keyed by (seed, output position),
    so its tokens do not depend on which other requests share the batch, nor on preemption.
    """

    def __init__(self, seed: int | None = None):
        self._rng = np.random.default_rng(seed)

    def sample(self, logits: mx.array, rows: list[SamplingRow]) -> SampleResult:
        assert logits.ndim == 2 and logits.shape[0] == len(rows), (logits.shape, len(rows))
        raw = _apply_allowed_masks(_as_numpy(logits), rows)
        if all(_is_plain_greedy(row) for row in rows):
            return SampleResult(raw.argmax(axis=-1).tolist(), [None] * len(rows))
        edited = _edit_logits(raw, rows)
        token_ids = np.empty(len(rows), dtype=np.int64)
        greedy = [i for i, row in enumerate(rows) if row.params.temperature < GREEDY_TEMPERATURE]
        if greedy:
            token_ids[greedy] = _take_rows(edited, greedy).argmax(axis=-1)
        for group in _random_groups(rows, raw.shape[1]):
            token_ids[group] = self._sample_random(_take_rows(edited, group), [rows[i] for i in group])
        return SampleResult(token_ids.tolist(), _logprobs(raw, rows, token_ids))

    def _sample_random(self, logits: np.ndarray, rows: list[SamplingRow]) -> np.ndarray:
        """Rows sharing one top_k (or none): temperature, filters and a draw, vectorized."""
        inv_temp = np.array([1.0 / r.params.temperature for r in rows], dtype=np.float32)[:, None]
        top_p = np.array([r.params.top_p for r in rows])
        min_p = np.array([r.params.min_p for r in rows], dtype=np.float32)
        top_k = rows[0].params.top_k
        if top_k is not None and top_k < logits.shape[1]:
            # Temperature keeps the order, so select on raw logits and scale only the candidates.
            ids, vals = _top_k(logits, top_k)
            weights = _filter_sorted(np.exp((vals - vals[:, :1]) * inv_temp), top_p, min_p)
            return ids[np.arange(len(rows)), _draw(weights, self.uniforms(rows))]
        # exp((x - max) / T) in place: each extra pass over (B, vocab) costs ~0.5 ms at B=32.
        weights = logits - logits.max(axis=-1, keepdims=True)
        weights *= inv_temp
        np.exp(weights, out=weights)  # the best token weighs 1
        cutoff = min_p  # min_p keeps weights >= min_p times the best one's
        nucleus = np.flatnonzero(top_p < 1.0)
        if nucleus.size:
            cutoff = cutoff.copy()
            nucleus_cutoff = _nucleus_cutoff(_take_rows(weights, nucleus), top_p[nucleus])
            cutoff[nucleus] = np.maximum(cutoff[nucleus], nucleus_cutoff)
        if (cutoff > 0).any():
            weights *= weights >= cutoff[:, None]
        return _draw(weights, self.uniforms(rows))

    def uniforms(self, rows: list[SamplingRow]) -> np.ndarray:
        """One uniform in [0, 1) per row: the RNG's for unseeded rows, `_seeded_uniform` for seeded ones.
        The device sampler draws with these too, so a seeded row's token does not depend on the path."""
        out = self._rng.random(len(rows))
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                out[i] = _seeded_uniform(row.params.seed, row.num_output_tokens)
        return out


def _take_rows(x: np.ndarray, rows: list[int] | np.ndarray) -> np.ndarray:
    """x[rows], without the (rows, vocab) copy of fancy indexing when `rows` is every row in order."""
    return x if len(rows) == len(x) else x[rows]


def _seeded_uniform(seed: int, position: int) -> float:
    """Output `position` of SplitMix64 seeded with `seed`, as a float in [0, 1): a pure function of
    (seed, position), so neither the batch nor a preemption-and-recompute changes a seeded token."""
    z = (seed + (position + 1) * _GOLDEN_GAMMA) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return ((z ^ (z >> 31)) >> 11) * 2.0**-53


def _as_numpy(logits: mx.array) -> np.ndarray:
    """A read-only float32 view; writing to it would write into the MLX array."""
    if logits.dtype != mx.float32:
        logits = logits.astype(mx.float32)
    view = np.asarray(logits)
    view.flags.writeable = False
    return view


def samples_on_device(request: Request) -> bool:
    """True when the request's next token is the plain argmax of its logits (no host-side edits,
    no logprobs), so the engine may leave it on the device and read it a step later."""
    p = request.params
    num_before = request.num_output_tokens + request.num_pending_tokens - 1  # outputs before this one
    return (
        p.temperature < GREEDY_TEMPERATURE
        and p.logprobs is None
        and p.structured is None
        and not p.logit_bias
        and not _has_penalty(p)
        and num_before >= p.min_tokens
    )


def _apply_allowed_masks(raw: np.ndarray, rows: list[SamplingRow]) -> np.ndarray:
    """A copy with each constrained row's disallowed tokens at -inf, or `raw` when no row is constrained.
    As vLLM, the grammar's mask comes before everything else, logprobs included."""
    constrained = [i for i, row in enumerate(rows) if row.allowed_token_mask is not None]
    if not constrained:
        return raw
    masks = np.stack([rows[i].allowed_token_mask for i in constrained])  # type: ignore[misc]
    bits = np.unpackbits(masks.view(np.uint8), axis=-1, count=raw.shape[1], bitorder="little")
    allowed, blocked = bits.view(bool), np.float32(-np.inf)
    if len(constrained) == len(rows):
        return np.where(allowed, raw, blocked)  # one pass, no copy first
    out = raw.copy()
    out[constrained] = np.where(allowed, raw[constrained], blocked)
    return out


def _is_plain_greedy(row: SamplingRow) -> bool:
    p = row.params
    return p.temperature < GREEDY_TEMPERATURE and p.logprobs is None and not _needs_edit(row)


def _needs_edit(row: SamplingRow) -> bool:
    return bool(row.params.logit_bias) or _has_penalty(row.params) or bool(_min_tokens_mask(row))


def _min_tokens_mask(row: SamplingRow) -> list[int]:
    """Token ids that may not be sampled yet because min_tokens is not reached."""
    if row.num_output_tokens >= row.params.min_tokens:
        return []
    eos = [] if row.params.ignore_eos else list(row.eos_token_ids)
    return eos + list(row.params.stop_token_ids)


def _edit_logits(raw: np.ndarray, rows: list[SamplingRow]) -> np.ndarray:
    """Applies logit_bias, the min_tokens mask and penalties to a copy; returns `raw` when none apply."""
    edit = [i for i, row in enumerate(rows) if _needs_edit(row)]
    if not edit:
        return raw
    out = raw.copy()
    for i in edit:
        row = rows[i]
        if row.params.logit_bias:
            ids = np.fromiter(row.params.logit_bias.keys(), dtype=np.int64)
            out[i, ids] += np.fromiter(row.params.logit_bias.values(), dtype=np.float32)
        masked = _min_tokens_mask(row)
        if masked:
            out[i, masked] = -np.inf
            if row.allowed_token_mask is not None and np.isneginf(out[i]).all():
                out[i] = raw[i]  # the grammar allows only EOS or a stop token: it wins over min_tokens
    if any(_has_penalty(rows[i].params) for i in edit):
        _apply_penalties(out, rows)
    return out


def _has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _apply_penalties(logits: np.ndarray, rows: list[SamplingRow]) -> None:
    """vLLM's penalties, in place: repetition over prompt+output, then frequency and presence over
    output. Sparse: it touches only the (row, token) pairs that occur, as flat indices."""
    flat = logits.reshape(-1)  # a view: `logits` is our own contiguous copy
    vocab = logits.shape[1]
    rep = np.array([r.params.repetition_penalty for r in rows]).clip(max=_F32_MAX).astype(np.float32)
    freq = np.array([r.params.frequency_penalty for r in rows], dtype=np.float32)
    presence = np.array([r.params.presence_penalty for r in rows], dtype=np.float32)
    output_rows = [i for i, r in enumerate(rows) if _has_penalty(r.params)]
    outputs = [rows[i].output_token_ids for i in output_rows]
    out_ids, out_counts = _flat_token_counts(outputs, output_rows, vocab)
    rep_rows = [i for i in output_rows if rep[i] != 1.0]
    if rep_rows:
        prompt_ids, _ = _flat_token_counts([rows[i].prompt_token_ids for i in rep_rows], rep_rows, vocab)
        seen = np.union1d(prompt_ids, out_ids)
        flat[seen] = _repetition_penalized(flat[seen], rep[seen // vocab])
    row_of = out_ids // vocab
    flat[out_ids] -= freq[row_of] * out_counts + presence[row_of]


def _repetition_penalized(vals: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """vLLM's rule (divide a positive logit, multiply a negative one), kept finite: a penalty that
    is 0 in float32 (5e-324) or tiny makes a logit overflow, and -inf times 0 is nan, which would
    unmask a token the grammar forbids. So a masked logit stays -inf and an overflow is float32's max."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        out = np.where(vals > 0, vals / penalty, vals * penalty)
    out[np.isneginf(vals)] = -np.inf
    return np.nan_to_num(out, nan=0.0, posinf=_F32_MAX, neginf=-np.inf)


def _flat_token_counts(
    token_lists: list[list[int]], row_ids: list[int], vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct `row * vocab + token` indices and their counts; ids outside the vocabulary are ignored."""
    lengths = [len(ids) for ids in token_lists]
    tokens = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=sum(lengths))
    row_of = np.repeat(np.asarray(row_ids, dtype=np.int64), lengths)
    keep = (tokens >= 0) & (tokens < vocab)
    return np.unique(row_of[keep] * vocab + tokens[keep], return_counts=True)


def _random_groups(rows: list[SamplingRow], vocab: int) -> list[list[int]]:
    """Random rows grouped by top_k, so a row's candidate set never depends on its neighbours."""
    groups: dict[int | None, list[int]] = {}
    for i, row in enumerate(rows):
        if row.params.temperature >= GREEDY_TEMPERATURE:
            top_k = row.params.top_k
            groups.setdefault(top_k if top_k is not None and top_k < vocab else None, []).append(i)
    return list(groups.values())


def _top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and values of each row's k largest entries, best first, ties by ascending id: a canonical
    order, so a seeded row draws the same token whatever else is in its batch."""
    if 4 * k > x.shape[1]:
        ids = np.argsort(-x, axis=-1, kind="stable")[:, :k]
        return ids, np.take_along_axis(x, ids, axis=-1)
    ids, vals = _compact(x, x >= _kth_lower_bound(x, k)[:, None])
    order = np.argsort(-vals, axis=-1, kind="stable")[:, :k]  # ids ascend within a row: ties by id
    return np.take_along_axis(ids, order, axis=-1), np.take_along_axis(vals, order, axis=-1)


def _top_values(x: np.ndarray, k: int) -> np.ndarray:
    """Each row's k largest values, best first."""
    if 4 * k > x.shape[1]:
        return -np.sort(-x, axis=-1)[:, :k]
    _, vals = _compact(x, x >= _kth_lower_bound(x, k)[:, None])
    return -np.sort(-vals, axis=-1)[:, :k]


def _kth_lower_bound(x: np.ndarray, k: int) -> np.ndarray:
    """A value at or below each row's k-th largest, found without sorting the row.

    The row is cut into at least max(4k, _MIN_GROUPS) strided groups. k groups have a maximum of at
    least the k-th largest group maximum, so k entries do, and so does every entry of the row's top k.
    Few other entries clear this bound. Strided groups make the maxima one vectorized pass."""
    num_rows, vocab = x.shape
    size = max(1, vocab // max(4 * k, _MIN_GROUPS))
    groups = vocab // size
    group_max = x[:, : groups * size].reshape(num_rows, size, groups).max(axis=1)
    return -np.partition(-group_max, k - 1, axis=-1)[:, k - 1]


def _compact(x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The masked entries of each row, ids ascending, padded to the longest row with (vocab, -inf)."""
    num_rows, vocab = x.shape
    flat = np.flatnonzero(mask)  # row-major; 2-D np.nonzero is ~15x slower
    rows, cols = np.divmod(flat, vocab)
    counts = np.bincount(rows, minlength=num_rows)
    starts = np.cumsum(counts) - counts
    slots = np.arange(len(rows)) - np.repeat(starts, counts)
    ids = np.full((num_rows, int(counts.max())), vocab, dtype=np.int64)
    vals = np.full(ids.shape, -np.inf, dtype=x.dtype)
    ids[rows, slots], vals[rows, slots] = cols, x[rows, cols]
    return ids, vals


def _filter_sorted(weights: np.ndarray, top_p: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """Zeroes what top_p and min_p drop from weights sorted best first (unnormalized probabilities)."""
    weights = weights.astype(np.float64)
    if (top_p < 1.0).any():
        # Keep a token while the mass ranked above it is below top_p (so at least one stays), as vLLM.
        cumulative = np.cumsum(weights, axis=-1)
        keep = (cumulative - weights < top_p[:, None] * cumulative[:, -1:]) | (top_p[:, None] >= 1.0)
        weights = np.where(keep, weights, 0.0)
    if (min_p > 0.0).any():
        weights = np.where(weights >= min_p[:, None] * weights[:, :1], weights, 0.0)
    return weights


def _nucleus_cutoff(weights: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Per row, the smallest weight top_p keeps, without sorting the vocabulary when possible.

    When a row's best `width` weights already hold top_p of its mass, every other token has at least
    top_p ranked above it and is cut, so the cut-off lies among those `width`. Ties at the cut-off are
    all kept."""
    target = top_p * weights.sum(axis=-1)
    cutoff = np.empty(len(weights), dtype=np.float32)
    pending = np.arange(len(weights))
    for width in (*_NUCLEUS_WIDTHS, weights.shape[1]):
        top = _top_values(_take_rows(weights, pending), width)
        cumulative = np.cumsum(top, axis=-1, dtype=np.float64)
        covered = (cumulative[:, -1] >= target[pending]) | (width >= weights.shape[1])
        num_kept = ((cumulative - top) < target[pending][:, None]).sum(axis=-1)
        cutoff[pending[covered]] = top[covered, num_kept[covered] - 1]
        pending = pending[~covered]
        if not pending.size:
            break
    return cutoff


def _draw(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw per row from unnormalized weights. Over a whole vocabulary it first picks a
    block by block sums, then a token inside it, because a full float64 cumsum costs ~10 ms at B=32."""
    num_rows, width = weights.shape
    rows = np.arange(num_rows)
    if width <= _FLAT_DRAW_MAX:
        return _draw_flat(weights, uniforms, rows)
    pad = -width % _DRAW_BLOCK
    padded = np.pad(weights, ((0, 0), (0, pad))) if pad else weights
    blocks = padded.reshape(num_rows, -1, _DRAW_BLOCK)
    block_mass = blocks.sum(axis=-1).astype(np.float64)
    block_cdf = np.cumsum(block_mass, axis=-1)
    target = uniforms * block_cdf[:, -1]
    block = np.minimum((block_cdf <= target[:, None]).sum(axis=-1), blocks.shape[1] - 1)
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero-mass block is caught below
        inner_uniforms = (target - block_cdf[rows, block] + block_mass[rows, block]) / block_mass[rows, block]
    inner = _draw_flat(blocks[rows, block], np.clip(np.nan_to_num(inner_uniforms), 0.0, 1.0), rows)
    choice = block * _DRAW_BLOCK + inner
    # Rounding can land on a zero weight (probability ~1e-16); take the row's best token then.
    bad = weights[rows, np.minimum(choice, width - 1)] <= 0
    choice[bad] = weights[bad].argmax(axis=-1)
    return choice


def _draw_flat(weights: np.ndarray, uniforms: np.ndarray, rows: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(weights, axis=-1, dtype=np.float64)
    choice = np.minimum((cdf <= (uniforms * cdf[:, -1])[:, None]).sum(axis=-1), weights.shape[1] - 1)
    bad = weights[rows, choice] <= 0
    choice[bad] = weights[bad].argmax(axis=-1)
    return choice


def _logprobs(raw: np.ndarray, rows: list[SamplingRow], token_ids: np.ndarray) -> list[TokenLogprob | None]:
    """Log-softmax of the raw model logits for the sampled token and the top `params.logprobs`."""
    out: list[TokenLogprob | None] = [None] * len(rows)
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return out
    sub = _take_rows(raw, wanted)
    peak = sub.max(axis=-1, keepdims=True)
    shifted = sub - peak
    log_total = peak + np.log(np.exp(shifted, out=shifted).sum(axis=-1, keepdims=True))
    chosen = sub[np.arange(len(wanted)), token_ids[wanted]] - log_total[:, 0]
    max_k = max(rows[i].params.logprobs or 0 for i in wanted)
    # Log-softmax keeps the order, so the top logprobs are the top logits shifted by log_total.
    top_ids, top_vals = _top_k(sub, max_k) if max_k else (np.empty((len(wanted), 0), np.int64),) * 2
    top_logprobs = np.maximum(top_vals - log_total, LOGPROB_FLOOR)  # -inf where a grammar masked
    for j, i in enumerate(wanted):
        k = rows[i].params.logprobs or 0
        top = list(zip(top_ids[j, :k].tolist(), top_logprobs[j, :k].tolist()))
        out[i] = TokenLogprob(int(token_ids[i]), float(chosen[j]), top)
    return out
