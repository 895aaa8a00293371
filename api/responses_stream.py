"""Responses API streams: output batches -> typed SSE events, each with `event:` and a `sequence_number`.

Owns the event order: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta per batch with text, response.output_text.done,
response.content_part.done, response.output_item.done, then response.completed (or response.incomplete
at max_output_tokens). With tool or reasoning parsing, the items between in_progress and completed
are api/responses_items.py's. With logprobs asked for, each delta carries its tokens' logprobs (tokens
whose text the detokenizer still holds go with the next delta) and the .done event all of them.
A failure after the first byte ends the stream with response.failed. No Ray, no MLX.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from engine.messages import RequestOutput, TokenLogprob

from api import sse
from api.choice_state import ChoiceState
from api.errors import ApiError
from api.openai_outputs import TokenText, logprob_token_ids
from api.output_parser import OutputParser, OutputParsing
from api.responses_items import OutputItems
from api.responses_outputs import (
    OutputItem,
    OutputText,
    ResponseMeta,
    ResponseObject,
    failed_response,
    final_status,
    finished_response,
    logprob_entries,
    output_message,
    started_response,
)
from api.responses_tools import ToolNames

logger = logging.getLogger(__name__)

Batches = AsyncGenerator[tuple[int, list[RequestOutput]], None]
TokenTexts = Callable[[set[int]], Awaitable[TokenText]]  # token ids -> their texts, for logprobs


class _Sequencer:
    """Frames events, numbering them from 0 in the order they are sent."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, name: str, **fields: Any) -> str:
        frame = sse.named_event(name, {"type": name, "sequence_number": self._next, **fields})
        self._next += 1
        return frame


async def response_events(
    meta: ResponseMeta,
    echo: dict[str, Any],
    state: ChoiceState,
    batches: Batches,
    on_finished: Callable[[list[OutputItem]], Awaitable[None]],
    parsing: OutputParsing | None = None,
    parallel: bool = True,
    names: ToolNames | None = None,
    token_texts: TokenTexts | None = None,
) -> AsyncIterator[str]:
    """`on_finished` gets the final output before the final event, so a follow-up sent on seeing it
    finds the response. With an active `parsing`, reasoning, message and function_call items stream
    as the output is read (api/responses_items.py), calls named as `names` declared them; else one
    message streams, with logprobs when `token_texts` is given."""
    if parsing is not None and parsing.active:
        event = _Sequencer()
        items = OutputItems(meta, event, parallel, names)
        async for frame in _parsed_events(meta, echo, state, batches, on_finished, parsing, (event, items)):
            yield frame
        return
    async for frame in _message_events(meta, echo, state, batches, on_finished, token_texts):
        yield frame


async def _message_events(
    meta: ResponseMeta,
    echo: dict[str, Any],
    state: ChoiceState,
    batches: Batches,
    on_finished: Callable[[list[OutputItem]], Awaitable[None]],
    token_texts: TokenTexts | None,
) -> AsyncIterator[str]:
    event = _Sequencer()
    started = started_response(meta, echo).dump()
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    yield event("response.output_item.added", output_index=0, item=_item(meta, state, "in_progress"))
    yield event("response.content_part.added", **_part_fields(meta), part=OutputText(text="").model_dump())
    logprobs = _Logprobs(token_texts)
    try:
        async with aclosing(batches):  # closing it cancels whatever generation is still running
            async for _, batch in batches:
                delta = state.add(batch)
                logprobs.hold(delta.logprobs)
                if delta.text:
                    fields = {"delta": delta.text, "logprobs": await logprobs.release()}
                    yield event("response.output_text.delta", **_part_fields(meta), **fields)
        await logprobs.release()
    except Exception as exc:  # noqa: BLE001  (_stream_error logs it)
        yield _failed_event(event, meta, echo, _stream_error(exc))
        return
    final = finished_response(meta, echo, state, logprobs=logprobs.rendered)
    await on_finished(final.output)
    for frame in _closing_events(event, meta, state, final, logprobs.rendered):
        yield frame


class _Logprobs:
    """Logprobs of tokens in no delta yet, and all rendered so far; none without `token_texts`."""

    def __init__(self, token_texts: TokenTexts | None):
        self._token_texts = token_texts
        self._held: list[TokenLogprob] = []
        self.rendered: list[dict[str, Any]] = []

    def hold(self, entries: list[TokenLogprob] | None) -> None:
        self._held += entries or []

    async def release(self) -> list[dict[str, Any]]:
        if self._token_texts is None or not self._held:
            return []
        held, self._held = self._held, []
        rendered = logprob_entries(held, await self._token_texts(logprob_token_ids(held)))
        self.rendered += rendered
        return rendered


async def _parsed_events(
    meta: ResponseMeta,
    echo: dict[str, Any],
    state: ChoiceState,
    batches: Batches,
    on_finished: Callable[[list[OutputItem]], Awaitable[None]],
    parsing: OutputParsing,
    framing: tuple[_Sequencer, OutputItems],  # the items frame their events with the sequencer
) -> AsyncIterator[str]:
    event, items = framing
    started = started_response(meta, echo).dump()
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    parser = OutputParser(parsing)
    try:
        async with aclosing(batches):
            async for _, batch in batches:
                for frame in items.frames(parser.feed(state.add(batch).text)):
                    yield frame
        closing = items.frames(parser.finish()) + items.close(final_status(state))
    except Exception as exc:  # noqa: BLE001  (_stream_error logs it)
        yield _failed_event(event, meta, echo, _stream_error(exc))
        return
    final = finished_response(meta, echo, state, items.output)
    await on_finished(final.output)
    for frame in closing:
        yield frame
    yield event(f"response.{final.status}", response=final.dump())


def _stream_error(exc: Exception) -> ApiError:
    """An ApiError as it is; anything else is logged and becomes a 500."""
    if isinstance(exc, ApiError):
        return exc
    logger.exception("stream failed")
    return ApiError(500, f"the stream failed: {type(exc).__name__}: {exc}", code="server_error")


def _failed_event(event: _Sequencer, meta: ResponseMeta, echo: dict[str, Any], exc: ApiError) -> str:
    return event("response.failed", response=_failed(meta, echo, exc).dump())


def _closing_events(
    event: _Sequencer, meta: ResponseMeta, state: ChoiceState, final: ResponseObject, logprobs: list[Any]
) -> list[str]:
    part = OutputText(text=state.text, logprobs=logprobs).model_dump()
    item = output_message(meta, state, final_status(state), logprobs).model_dump()
    return [
        event("response.output_text.done", **_part_fields(meta), text=state.text, logprobs=logprobs),
        event("response.content_part.done", **_part_fields(meta), part=part),
        event("response.output_item.done", output_index=0, item=item),
        event(f"response.{final.status}", response=final.dump()),
    ]


def _part_fields(meta: ResponseMeta) -> dict[str, Any]:
    return {"item_id": meta.item_id, "output_index": 0, "content_index": 0}


def _item(meta: ResponseMeta, state: ChoiceState, status: Any) -> dict[str, Any]:
    """The message as output_item.added shows it: no content part yet."""
    return {**output_message(meta, state, status).model_dump(), "content": []}


def _failed(meta: ResponseMeta, echo: dict[str, Any], exc: ApiError) -> ResponseObject:
    return failed_response(meta, echo, exc.code or "server_error", exc.message)
