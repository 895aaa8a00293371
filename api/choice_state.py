"""Accumulates one engine request's `RequestOutput` batches: text, token ids, counts, finish and stop reason.

Dialect-neutral: every API dialect (OpenAI chat/completions, Anthropic Messages, OpenAI Responses) builds
its wire objects from a `ChoiceState`. A failed or aborted request raises an `ApiError`. No Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.messages import RequestOutput, TokenLogprob

from api.errors import SERVER_ERROR, ApiError


@dataclass
class Delta:
    """What one batch added to a choice."""

    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    text_offset: int  # length of the choice's text before this delta

    @property
    def empty(self) -> bool:
        return not self.text and not self.logprobs and self.finish_reason is None


@dataclass
class ChoiceState:
    """Accumulates one choice's batches; `num_prompt_tokens` may be preset to the prompt's length.

    `stop_reason` is the engine's: the matched stop string, the stop token id, or None.
    `counts_prompt` is False for a prompt's samples after its first (`n` > 1): usage counts each prompt once."""

    index: int
    num_prompt_tokens: int = 0
    text: str = ""
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] = field(default_factory=list)
    counts_prompt: bool = True

    def add(self, batch: Iterable[RequestOutput]) -> Delta:
        offset, parts, logprobs = len(self.text), [], []
        for out in batch:
            raise_if_failed(out)
            parts.append(out.new_text)
            self.token_ids.extend(out.new_token_ids)
            logprobs.extend(out.logprobs or [])
            self._count(out)
            self.finish_reason = out.finish_reason or self.finish_reason
            self.stop_reason = out.stop_reason if out.finished else self.stop_reason
        text = "".join(parts)
        self.text += text
        if logprobs:
            self.logprobs = (self.logprobs or []) + logprobs
        return Delta(text, logprobs or None, self.finish_reason, offset)

    def _count(self, out: RequestOutput) -> None:
        self.num_prompt_tokens = max(self.num_prompt_tokens, out.num_prompt_tokens)
        self.num_cached_tokens = max(self.num_cached_tokens, out.num_cached_tokens)
        self.num_output_tokens = max(self.num_output_tokens, out.num_output_tokens, len(self.token_ids))


def raise_if_failed(out: RequestOutput) -> None:
    if out.finish_reason == "error":
        if out.error_param is not None:  # the request's fault, found only while it ran
            raise ApiError(
                400, out.error or "the request cannot be served", param=out.error_param, code="invalid_value"
            )
        raise ApiError(
            500, out.error or "the request failed in the engine", SERVER_ERROR, code="request_failed"
        )
    if out.finish_reason == "abort":
        raise ApiError(500, "the engine aborted the request", SERVER_ERROR, code="request_aborted")
