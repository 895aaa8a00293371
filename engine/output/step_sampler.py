"""One engine step's sampling: a SamplingRow per request, sampled on the host (engine/output/sampler.py)
or on the device (engine/output/device_sampler.py), and device tokens read back as plain results.

Owns both samplers and the RNG of unseeded rows. It never commits a token nor changes request state: the
engine commits what comes back, and a row whose sampling raises comes back failed, alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.messages import TokenLogprob
from engine.output import draw_kernel
from engine.output.device_sampler import DeviceSample, joins_pipeline, sample_on_device
from engine.output.sampler import Sampler, SampleResult, SamplingRow
from engine.output.structured_output import StructuredOutputManager
from engine.runner.model_runner import DeviceTokens, StepLogits

import mlx.core as mx

logger = logging.getLogger(__name__)


@dataclass
class Sampled:
    """Tokens known on the host for `items` (rows of a step), and the requests whose sampling raised."""

    items: list[ScheduledRequest]
    token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
    failed: list[tuple[list[Request], Exception, str]] = field(default_factory=list)  # requests, error, stage


@dataclass
class Launch:
    """A step's rows as the device sampler launched them: `later` stay on the device until the next step
    reads them; the rest are read in this step by `StepSampler.read_now`."""

    step: StepLogits
    rows: list[SamplingRow] | None  # None: they could not be built, and every row fails with `error`
    later: DeviceTokens | None = None
    now: DeviceTokens | None = None
    error: Exception | None = None  # with rows: the batch failed to launch, so rows are sampled one by one


class StepSampler:
    def __init__(
        self, seed: int, eos_token_ids: set[int], structured: StructuredOutputManager, on_device: bool
    ):
        self.host = Sampler(seed)  # the device path draws its uniforms from the same RNG
        self.on_device = on_device
        # On MLX's CUDA backend, mixed batches choose their tokens in one checked kernel.
        self.draw = draw_kernel.for_device() if on_device else None
        self.eos_token_ids = eos_token_ids
        self.structured = structured

    def rows(self, items: list[ScheduledRequest]) -> list[SamplingRow]:
        return [
            SamplingRow(
                r.params,
                r.prompt_token_ids,
                r.output_token_ids,
                self.eos_token_ids,
                allowed_token_mask=self.structured.mask(r.request_id),
                # Earlier outputs still on the device; this step's own token is pending too.
                num_pending_outputs=max(0, r.num_pending_tokens - 1),
            )
            for r in (s.request for s in items)
        ]

    def on_host(self, step: StepLogits) -> Sampled:
        """Every row sampled on the host, read now (or chosen by the forward already: `token_ids`)."""
        if step.token_ids is not None:
            return Sampled(step.items, {s.request.request_id: t for s, t in zip(step.items, step.token_ids)})
        try:
            mx.eval(step.logits)
            rows = self.rows(step.items)
        except Exception as exc:  # noqa: BLE001  (the engine logs it when it fails the requests)
            return Sampled(step.items, failed=[([s.request for s in step.items], exc, "step")])
        try:
            result = self.host.sample(step.logits, rows)
        except Exception:
            logger.exception("batched sampling failed; sampling row by row so only the bad rows fail")
            return self._rows_apart(step, rows, range(len(rows)))
        return _sampled(step.items, result)

    def launch(self, step: StepLogits, pipeline: bool) -> Launch:
        """Every row sampled on the device, lazily. With `pipeline`, rows that `joins_pipeline` stay there
        (`Launch.later`); the others are read by `read_now`."""
        try:
            rows = self.rows(step.items)
        except Exception as exc:  # noqa: BLE001  (read_now fails every row with it)
            return Launch(step, None, error=exc)
        try:
            sample = sample_on_device(step.logits, rows, self.host.uniforms(rows), self.draw)
            mx.async_eval(*sample.arrays())
        except Exception as exc:  # read_now samples the rows one by one
            logger.exception("batched device sampling failed; sampling row by row so only the bad rows fail")
            return Launch(step, rows, error=exc)
        later = [i for i, s in enumerate(step.items) if pipeline and joins_pipeline(s.request)]
        staying = set(later)
        now = [i for i in range(len(rows)) if i not in staying]
        return Launch(step, rows, _tokens(step, sample, later), _tokens(step, sample, now))

    def read_now(self, launch: Launch) -> Sampled:
        """The launched rows that do not stay on the device; if reading them fails, they are sampled again
        one by one, so only a row that fails alone fails."""
        items = launch.step.items
        if launch.rows is None:
            assert launch.error is not None
            return Sampled(items, failed=[([s.request for s in items], launch.error, "step")])
        if launch.error is not None:
            return self._rows_apart(launch.step, launch.rows, range(len(items)))
        if launch.now is None:
            return Sampled([])
        try:
            return _read(launch.now)
        except Exception:
            logger.exception("device sampling failed; sampling row by row so only the bad rows fail")
            return self._rows_apart(launch.step, launch.rows, launch.now.rows.values())

    @staticmethod
    def read(tokens: DeviceTokens) -> Sampled:
        """A launched step's tokens (and logprobs); if reading fails, every one of its requests fails."""
        try:
            return _read(tokens)
        except Exception as exc:  # noqa: BLE001  (the engine logs it when it fails the requests)
            return Sampled(tokens.items, failed=[([s.request for s in tokens.items], exc, "step")])

    def _rows_apart(self, step: StepLogits, rows: list[SamplingRow], indices: Iterable[int]) -> Sampled:
        """One row at a time: a request whose sampling raises fails alone, the others get their token."""
        indices = list(indices)
        out = Sampled([step.items[i] for i in indices])
        for i in indices:
            request = step.items[i].request
            try:
                one = self._sample_one(step.logits[i : i + 1], rows[i])
            except Exception as exc:  # noqa: BLE001  (any failure of one row is that request's alone)
                out.failed.append(([request], exc, "sampling"))
                continue
            out.token_ids[request.request_id] = one.token_ids[0]
            if one.logprobs[0] is not None:
                out.logprobs[request.request_id] = [one.logprobs[0]]
        return out

    def _sample_one(self, logits: mx.array, row: SamplingRow) -> SampleResult:
        if self.on_device:
            return sample_on_device(logits, [row], self.host.uniforms([row]), self.draw).read()
        return self.host.sample(logits, [row])


def _tokens(step: StepLogits, sample: DeviceSample, rows: list[int]) -> DeviceTokens | None:
    if not rows:
        return None
    return DeviceTokens([step.items[i] for i in rows], sample.token_ids, rows, sample.logprobs)


def _read(tokens: DeviceTokens) -> Sampled:
    token_ids: list[int] = tokens.token_ids.tolist()  # type: ignore[assignment]  # (B,) int32
    by_row = tokens.logprobs.read(token_ids) if tokens.logprobs is not None else {}
    sampled = {rid: token_ids[row] for rid, row in tokens.rows.items()}
    logprobs = {rid: [by_row[row]] for rid, row in tokens.rows.items() if row in by_row}
    return Sampled(tokens.items, sampled, logprobs)


def _sampled(items: list[ScheduledRequest], result: SampleResult) -> Sampled:
    ids = [s.request.request_id for s in items]
    logprobs = {rid: [lp] for rid, lp in zip(ids, result.logprobs) if lp is not None}
    return Sampled(items, dict(zip(ids, result.token_ids)), logprobs)
