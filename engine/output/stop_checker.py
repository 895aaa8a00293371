"""One request's stop conditions: EOS, stop token ids, max_tokens, and stop strings in streamed text.

Owns the text held back because it could still become a stop string; never touches tokens' text
(engine.detokenizer) or the request itself. Follows vLLM: EOS and stop token ids cannot stop a
request before min_tokens output tokens, nor can a stop string that ends in text from those tokens.

Stream contract: for each output token call `check_token`, then feed that token's new text to
`process_text`; at a finish that `process_text` did not cause, call `flush`.
"""

from __future__ import annotations

from engine.messages import FinishReason, SamplingParams

StopResult = tuple[FinishReason, str | int | None]  # (finish reason, matched stop string or token id)


class StopChecker:
    def __init__(self, params: SamplingParams, eos_token_ids: set[int], max_tokens: int):
        assert max_tokens >= 1, max_tokens
        self._eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self._stop_token_ids = set(params.stop_token_ids)
        self._min_tokens = params.min_tokens
        self._max_tokens = max_tokens
        self._stops = list(dict.fromkeys(params.stop))
        self._include_stop = params.include_stop_str_in_output
        self._num_output_tokens = 0
        self._held = ""  # text not yet emitted: it may be the start of a stop string
        self._num_protected = 0  # leading chars of _held from tokens up to min_tokens
        self._finished = False

    def check_token(self, token_id: int, num_output_tokens: int) -> StopResult | None:
        """`num_output_tokens` counts this token. EOS or a stop token id at max_tokens reports "stop"."""
        self._num_output_tokens = num_output_tokens
        if num_output_tokens >= self._min_tokens:
            if token_id in self._eos_token_ids:
                return "stop", None
            if token_id in self._stop_token_ids:
                return "stop", token_id
        if num_output_tokens >= self._max_tokens:
            return "length", None
        return None

    def process_text(self, new_text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit now, matched stop string or None). After a match the emitted text
        ends before the stop string (or after it, with include_stop_str_in_output); nothing further
        is ever emitted."""
        if self._finished:
            return "", None
        self._held += new_text
        if self._min_tokens and self._num_output_tokens <= self._min_tokens:
            self._num_protected = len(self._held)
        match = self._find_stop()
        if match is None:
            return self._release(len(self._held) - self._hold_back_len()), None
        start, stop = match
        self._finished = True
        text = self._held[: start + len(stop) if self._include_stop else start]
        self._held = ""
        return text, stop

    def flush(self) -> str:
        """At a finish without a stop-string match: releases the held-back text."""
        text = "" if self._finished else self._held
        self._held, self._finished = "", True
        return text

    def _find_stop(self) -> tuple[int, str] | None:
        """The stop string occurrence that ends first (the longer one on a tie), as a token-by-token
        stream would see it, ignoring occurrences that end inside protected text."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = self._held.find(stop, max(0, self._num_protected - len(stop) + 1))
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        return None if best is None else (best[1], best[2])

    def _hold_back_len(self) -> int:
        """Length of the longest tail of _held that is a proper prefix of some stop string. Held even
        with include_stop_str_in_output: the search only sees _held, so a match needs all of it there."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(self._held)), longest, -1):
                if self._held.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def _release(self, num_chars: int) -> str:
        text, self._held = self._held[:num_chars], self._held[num_chars:]
        self._num_protected = max(0, self._num_protected - num_chars)
        return text
