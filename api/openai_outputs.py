"""Engine `RequestOutput` batches -> OpenAI chat.completion(.chunk) and text_completion objects.

Owns usage and the OpenAI rendering of each choice; api/choice_state.py accumulates the batches (and
raises the `ApiError` of a failed request). Each sample of each engine request is one choice. No Ray, no MLX.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.messages import TokenLogprob

from api.choice_state import ChoiceState, Delta
from api.openai_responses import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprob,
    ChatMessageOut,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Embedding,
    EmbeddingList,
    EmbeddingUsage,
    PromptTokensDetails,
    TopLogprob,
    Usage,
)
from api.openai_tools import delta_fields, finish_reason, message_fields
from api.output_parser import OutputParser, OutputParsing, parse_whole

TokenText = Mapping[int, str]  # token id -> its text, for logprobs


@dataclass(frozen=True)
class ResponseMeta:
    """What every object of one response shares."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseMeta:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)


def usage(states: Iterable[ChoiceState]) -> Usage:
    """Each prompt once (a prompt's `n` samples share it), every choice's completion tokens."""
    states = list(states)
    prompt = sum(s.num_prompt_tokens for s in states if s.counts_prompt)
    completion = sum(s.num_output_tokens for s in states)
    cached = sum(s.num_cached_tokens for s in states if s.counts_prompt)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


def logprob_token_ids(entries: Iterable[TokenLogprob] | None) -> set[int]:
    """Every token id whose text a logprobs rendering needs."""
    ids: set[int] = set()
    for entry in entries or ():
        ids.add(entry.token_id)
        ids.update(token_id for token_id, _ in entry.top)
    return ids


# --- chat --------------------------------------------------------------------------------------


def chat_completion(
    meta: ResponseMeta, states: list[ChoiceState], text: TokenText, parsing: OutputParsing | None = None
) -> ChatCompletion:
    """`parsing`: how to read tool calls and reasoning out of each choice's text (None: plain text)."""
    choices = []
    for s in states:
        parser = parse_whole(parsing, s.text) if parsing is not None and parsing.active else None
        message = ChatMessageOut(**message_fields(parser)) if parser else ChatMessageOut(content=s.text)
        choices.append(
            ChatChoice(
                index=s.index,
                message=message,
                logprobs=_chat_logprobs(s.logprobs, text),
                finish_reason=finish_reason(s.finish_reason, parser),
            )
        )
    return ChatCompletion(
        id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage(states)
    )


def chat_chunk(
    meta: ResponseMeta,
    index: int,
    delta: Delta,
    first: bool,
    with_usage: bool,
    text: TokenText,
    parser: OutputParser | None = None,
) -> ChatCompletionChunk | None:
    """One chunk for one batch; None when the batch added nothing (text held back by the detokenizer,
    or by `parser` while it might be part of a tool-call tag)."""
    fields: dict[str, Any] = {"content": delta.text} if delta.text or first else {}
    if parser is not None:
        events = parser.feed(delta.text) + (parser.finish() if delta.finish_reason else [])
        fields = delta_fields(events) or ({"content": ""} if first else {})
    if not fields and delta.finish_reason is None and not delta.logprobs and not first:
        return None
    choice = ChatChunkChoice(
        index=index,
        delta=ChatDelta(role="assistant", **fields) if first else ChatDelta(**fields),
        logprobs=_chat_logprobs(delta.logprobs, text),
        finish_reason=finish_reason(delta.finish_reason, parser),
    )
    chunk = ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[choice])
    if with_usage:
        chunk.usage = None  # marks the field set: OpenAI sends "usage": null on every chunk but the last
    return chunk


def chat_usage_chunk(meta: ResponseMeta, states: list[ChoiceState]) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage(states)
    )


def _chat_logprobs(entries: list[TokenLogprob] | None, text: TokenText) -> ChatChoiceLogprobs | None:
    if entries is None:
        return None
    content = [
        ChatLogprob(
            token=text[e.token_id],
            logprob=e.logprob,
            bytes=list(text[e.token_id].encode()),
            top_logprobs=[
                TopLogprob(token=text[t], logprob=lp, bytes=list(text[t].encode())) for t, lp in e.top
            ],
        )
        for e in entries
    ]
    return ChatChoiceLogprobs(content=content)


# --- text completions --------------------------------------------------------------------------


def completion(meta: ResponseMeta, states: list[ChoiceState], text: TokenText) -> Completion:
    choices = [
        CompletionChoice(
            index=s.index,
            text=s.text,
            logprobs=_completion_logprobs(s.logprobs, text, 0),
            finish_reason=s.finish_reason,
        )
        for s in states
    ]
    return Completion(
        id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage(states)
    )


def completion_chunk(
    meta: ResponseMeta, index: int, delta: Delta, with_usage: bool, text: TokenText
) -> Completion | None:
    if delta.empty:
        return None
    choice = CompletionChoice(
        index=index,
        text=delta.text,
        logprobs=_completion_logprobs(delta.logprobs, text, delta.text_offset),
        finish_reason=delta.finish_reason,
    )
    chunk = Completion(id=meta.id, created=meta.created, model=meta.model, choices=[choice])
    if with_usage:
        chunk.usage = None
    return chunk


def completion_usage_chunk(meta: ResponseMeta, states: list[ChoiceState]) -> Completion:
    return Completion(id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage(states))


def _completion_logprobs(
    entries: list[TokenLogprob] | None, text: TokenText, offset: int
) -> CompletionLogprobs | None:
    if entries is None:
        return None
    out = CompletionLogprobs()
    for e in entries:
        token = text[e.token_id]
        out.tokens.append(token)
        out.token_logprobs.append(e.logprob)
        out.top_logprobs.append({text[t]: lp for t, lp in e.top})
        out.text_offset.append(offset)
        offset += len(token)
    return out


# --- embeddings --------------------------------------------------------------------------------


def embedding_list(
    model: str, vectors: list[list[float]], num_tokens: int, encoding_format: str | None
) -> EmbeddingList:
    data = [Embedding(index=i, embedding=_encode_vector(v, encoding_format)) for i, v in enumerate(vectors)]
    usage = EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
    return EmbeddingList(data=data, model=model, usage=usage)


def _encode_vector(vector: list[float], encoding_format: str | None) -> list[float] | str:
    if encoding_format == "base64":  # what the openai SDK asks for by default: little-endian float32
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector
