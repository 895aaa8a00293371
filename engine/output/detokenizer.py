"""Incremental detokenization of one request's output: token ids in, newly completed text out.

Owns one request's decode window (a few ids and two offsets) and the text emitted so far; it never
touches stop strings (engine.stop_checker) or any tokenizer state.

vLLM's prefix/read offsets: ids[prefix:read] is text already emitted, kept as left context so that
tokenizers which rewrite the start of a sequence (SentencePiece drops the leading space of the first
token) decode the new ids exactly as inside the whole text. New text is decode(ids[prefix:]) minus
decode(ids[prefix:read]); it is held back while it ends in U+FFFD, an incomplete UTF-8 sequence
(byte-level BPE and byte-fallback tokens split multi-byte characters), and an output that ends there
(cut by max_tokens) drops those bytes, as vLLM does: a reply never ends in a broken character. Each
step decodes a few ids, so the cost per token does not grow with the output.

Cross-token clean-up (HF `clean_up_tokenization_spaces`) cannot be streamed and is never applied.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import tokenizers

_PROMPT_CONTEXT = 5  # prompt ids kept as left context for the first output token, as vLLM
_TRIM_AT = 256  # drop ids left of the window once this many pile up
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Streams one request's text. `tokenizer` is a Hugging Face tokenizer, an mlx-lm
    TokenizerWrapper around one, or a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self._decode = _decode_fn(tokenizer, skip_special_tokens)
        self._ids = _prompt_context(self._decode, prompt_token_ids)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self._pieces: list[str] = []
        self._text: str | None = ""

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        if self._text is None:
            self._text = "".join(self._pieces)
        return self._text

    def add_tokens(self, token_ids: list[int]) -> str:
        """Appends output ids; returns only the text they complete (possibly empty)."""
        new_pieces = []
        for token_id in token_ids:
            self._ids.append(token_id)
            piece = self._step(final=False)
            if piece:
                new_pieces.append(piece)
        return self._emit("".join(new_pieces))

    def flush(self) -> str:
        """At finish: whatever is still held back, less the bytes of a character left incomplete."""
        return self._emit(self._step(final=True).rstrip(_INCOMPLETE))

    def _step(self, final: bool) -> str:
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(self._prefix_text):
            return ""  # e.g. a skipped special token: nothing new yet
        if new_text.endswith(_INCOMPLETE) and not final:
            return ""
        piece = new_text[len(self._prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        self._trim()
        return piece

    def _trim(self) -> None:
        if self._prefix_offset >= _TRIM_AT:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0

    def _emit(self, text: str) -> str:
        if text:
            self._pieces.append(text)
            self._text = None
        return text


def _prompt_context(decode: Callable[[list[int]], str], prompt_token_ids: list[int]) -> list[int]:
    """About the last _PROMPT_CONTEXT prompt ids, starting on a character boundary: byte tokens of a
    character cut in half decode as U+FFFD and can spoil the whole run of byte tokens after them."""
    sizes = (*range(_PROMPT_CONTEXT, 3 * _PROMPT_CONTEXT), *range(_PROMPT_CONTEXT - 1, 0, -1))
    for size in sizes:
        context = prompt_token_ids[-size:]
        if len(context) == size and not decode(context).startswith(_INCOMPLETE):
            return list(context)
    return []


def _decode_fn(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """The cheapest decode that matches the tokenizer's: the Rust one when there is one."""
    rust = _rust_tokenizer(tokenizer)
    if rust is not None:
        return partial(rust.decode, skip_special_tokens=skip_special_tokens)
    # A slow (Python) HF tokenizer, possibly inside mlx-lm's TokenizerWrapper (which keeps it as _tokenizer).
    hf = tokenizer if hasattr(tokenizer, "convert_ids_to_tokens") else tokenizer._tokenizer
    return partial(hf.decode, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def _rust_tokenizer(tokenizer: Any) -> tokenizers.Tokenizer | None:
    for candidate in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        if isinstance(candidate, tokenizers.Tokenizer):
            return candidate
        backend = getattr(candidate, "backend_tokenizer", None)
        if isinstance(backend, tokenizers.Tokenizer):
            return backend
    return None
