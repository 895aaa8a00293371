"""Anthropic Messages streams: output batches -> named SSE events in Anthropic's order.

Owns the event protocol: message_start, content_block_start, ping, content_block_delta (text_delta) per
batch with text, content_block_stop, message_delta (stop_reason, usage.output_tokens), message_stop.
A failure after the first byte is sent as one `event: error` frame, and the stream ends there.
No Ray, no MLX.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from engine.messages import RequestOutput

from api import sse
from api.anthropic_blocks import BlockStream
from api.anthropic_errors import error_body
from api.anthropic_outputs import TOOL_USE_ID_PREFIX, MessageMeta, started_message, stop_fields
from api.choice_state import ChoiceState
from api.errors import ApiError, internal_error
from api.output_parser import OutputParser, OutputParsing

logger = logging.getLogger(__name__)

TEXT_INDEX = 0  # the one content block this server streams


def _event(name: str, **fields: Any) -> str:
    return sse.named_event(name, {"type": name, **fields})


async def message_events(
    meta: MessageMeta,
    state: ChoiceState,
    batches: AsyncGenerator[tuple[int, list[RequestOutput]], None],
    parsing: OutputParsing | None = None,
) -> AsyncIterator[str]:
    """`state.num_prompt_tokens` must be preset: message_start reports it before any batch arrives.
    With an active `parsing`, thinking, text and tool_use blocks stream as the output is read."""
    if parsing is not None and parsing.active:
        async for frame in _parsed_events(meta, state, batches, OutputParser(parsing, TOOL_USE_ID_PREFIX)):
            yield frame
        return
    yield _event("message_start", message=started_message(meta, state.num_prompt_tokens).dump())
    yield _event("content_block_start", index=TEXT_INDEX, content_block={"type": "text", "text": ""})
    yield _event("ping")
    try:
        async with aclosing(batches):  # closing it cancels whatever generation is still running
            async for _, batch in batches:
                if text := state.add(batch).text:
                    delta = {"type": "text_delta", "text": text}
                    yield _event("content_block_delta", index=TEXT_INDEX, delta=delta)
    except ApiError as exc:
        yield error_event(exc)
        return
    except Exception as exc:
        logger.exception("stream failed")
        yield error_event(internal_error(f"the stream failed: {type(exc).__name__}: {exc}"))
        return
    for frame in closing_events(state):
        yield frame


async def _parsed_events(
    meta: MessageMeta,
    state: ChoiceState,
    batches: AsyncGenerator[tuple[int, list[RequestOutput]], None],
    parser: OutputParser,
) -> AsyncIterator[str]:
    blocks = BlockStream(_event)
    yield _event("message_start", message=started_message(meta, state.num_prompt_tokens).dump())
    yield _event("ping")
    try:
        async with aclosing(batches):
            async for _, batch in batches:
                for frame in blocks.frames(parser.feed(state.add(batch).text)):
                    yield frame
        closing = blocks.frames(parser.finish()) + blocks.close()
    except ApiError as exc:
        yield error_event(exc)
        return
    except Exception as exc:
        logger.exception("stream failed")
        yield error_event(internal_error(f"the stream failed: {type(exc).__name__}: {exc}"))
        return
    for frame in closing + closing_events(state, blocks.num_tool_uses > 0)[1:]:
        yield frame


def closing_events(state: ChoiceState, called: bool = False) -> list[str]:
    stop_reason, stop_sequence = stop_fields(state, called)
    return [
        _event("content_block_stop", index=TEXT_INDEX),
        _event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            usage={"output_tokens": state.num_output_tokens},
        ),
        _event("message_stop"),
    ]


def error_event(exc: ApiError) -> str:
    return sse.named_event("error", error_body(exc))
