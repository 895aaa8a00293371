"""Turns sampled tokens into `RequestOutput` deltas: detokenization, stop conditions, logprobs.

Owns each live request's detokenizer and stop checker. Decides *that* a request finishes; the
scheduler is the one that removes it and frees its blocks. A constrained request also finishes
("stop") when the structured-output manager reports its grammar complete; the manager's matcher
sees every committed token here, once, and is dropped at every finish.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.core.request import Request
from engine.messages import FinishReason, RequestOutput, TokenLogprob
from engine.output.detokenizer import IncrementalDetokenizer
from engine.output.stop_checker import StopChecker
from engine.output.structured_output import StructuredOutputManager


@dataclass
class _Track:
    detokenizer: IncrementalDetokenizer
    stop_checker: StopChecker
    logprobs: list[TokenLogprob]


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: set[int], structured: StructuredOutputManager | None = None):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.structured = structured
        self._tracks: dict[str, _Track] = {}

    def add(self, request: Request) -> None:
        params = request.params
        self._tracks[request.request_id] = _Track(
            IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.skip_special_tokens),
            StopChecker(params, self.eos_token_ids, request.max_tokens),
            [],
        )

    def remove(self, request_id: str) -> None:
        self._tracks.pop(request_id, None)
        if self.structured is not None:
            self.structured.remove(request_id)

    def process(self, request: Request, token_ids: list[int], logprobs: list[TokenLogprob]) -> RequestOutput:
        """Feeds one step's new tokens of one request; marks the request finished if it must stop."""
        track = self._tracks[request.request_id]
        finish, grammar_end = None, None
        for i, token_id in enumerate(token_ids):
            finish = track.stop_checker.check_token(
                token_id, request.num_output_tokens - len(token_ids) + i + 1
            )
            if self.structured is not None:
                grammar_end = self.structured.accept(request.request_id, token_id)
            if finish is not None or grammar_end is not None:
                break
        reason, stop_reason = finish if finish is not None else (None, None)
        # The stopping token itself (EOS, a stop token id) is not text the client sees.
        text_ids = token_ids if reason is None or reason == "length" else token_ids[:-1]
        if grammar_end is not None and reason in (None, "length"):
            reason, stop_reason = grammar_end, None  # a complete grammar is a stop, even at max_tokens
        text = track.detokenizer.add_tokens(text_ids) if text_ids else ""
        emitted, matched = track.stop_checker.process_text(text)
        if matched is not None:
            reason, stop_reason = "stop", matched
        elif reason is not None:
            tail, matched = track.stop_checker.process_text(track.detokenizer.flush())
            emitted += tail
            if matched is not None:
                reason, stop_reason = "stop", matched
            else:
                emitted += track.stop_checker.flush()
        if reason is not None:
            request.finish_reason, request.stop_reason = reason, stop_reason
        broke = grammar_end == "error" and reason == "error"
        failure = None
        if broke and self.structured is not None and request.params.structured is not None:
            failure = self.structured.failure(request.request_id, request.params.structured)
        output = self._output(request, token_ids, emitted, logprobs, reason, stop_reason)  # drops the matcher
        if broke:
            output.error = failure.message if failure else "the sampled token broke the request's grammar"
            output.error_param = failure.param if failure else None
        return output

    def abort(self, request: Request, reason: FinishReason, error: str | None = None) -> RequestOutput:
        request.finish_reason = reason
        output = self._output(request, [], "", [], reason, None)
        output.error = error
        return output

    def _output(
        self,
        request: Request,
        token_ids: list[int],
        text: str,
        logprobs: list[TokenLogprob],
        reason: FinishReason | None,
        stop_reason: str | int | None,
    ) -> RequestOutput:
        if reason is not None:
            self.remove(request.request_id)
        return RequestOutput(
            request_id=request.external_id,  # a sample of an n > 1 request reports its parent's id
            new_token_ids=token_ids,
            new_text=text,
            finish_reason=reason,
            stop_reason=stop_reason,
            logprobs=logprobs if request.params.logprobs is not None else None,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
            index=request.index,
        )


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """One delta for several consecutive ones of the same request (a step that emitted several tokens)."""
    assert outputs, "a verified row emits at least one token"
    last = outputs[-1]
    logprobs = None if last.logprobs is None else [lp for o in outputs for lp in o.logprobs or []]
    return replace(
        last,
        new_token_ids=[t for o in outputs for t in o.new_token_ids],
        new_text="".join(o.new_text for o in outputs),
        logprobs=logprobs,
        error=next((o.error for o in outputs if o.error), None),
        error_param=next((o.error_param for o in outputs if o.error_param), None),
    )
