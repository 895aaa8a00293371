"""OpenAI streams: (choice index, output batch) pairs -> SSE frames, one chunk per batch.

Owns the stream's shape: chunks, then the usage chunk if asked for, then `[DONE]`. A failure after the
first byte can no longer change the status line, so it is sent as an error event before `[DONE]`.
No Ray, no MLX: token texts for logprobs come from the `token_texts` callable.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol

from engine.messages import RequestOutput

from api import sse
from api.choice_state import ChoiceState, Delta
from api.errors import ApiError, internal_error
from api.openai_outputs import TokenText, logprob_token_ids

logger = logging.getLogger(__name__)


class _Dumpable(Protocol):
    def dump(self) -> dict[str, Any]: ...


ChunkFn = Callable[[int, Delta, bool, TokenText], _Dumpable | None]  # (index, delta, first, texts)


async def sse_frames(
    batches: AsyncGenerator[tuple[int, list[RequestOutput]], None],
    states: list[ChoiceState],
    chunk: ChunkFn,
    usage_chunk: Callable[[], _Dumpable] | None,
    token_texts: Callable[[set[int]], Awaitable[TokenText]],
) -> AsyncIterator[str]:
    started: set[int] = set()
    try:
        async with aclosing(batches):  # closing it cancels whatever generation is still running
            async for index, batch in batches:
                delta = states[index].add(batch)
                out = chunk(
                    index, delta, index not in started, await token_texts(logprob_token_ids(delta.logprobs))
                )
                started.add(index)
                if out is not None:
                    yield sse.event(out.dump())
        if usage_chunk is not None:
            yield sse.event(usage_chunk().dump())
    except ApiError as exc:
        yield sse.event(exc.body())
    except Exception as exc:
        logger.exception("stream failed")
        yield sse.event(internal_error(f"the stream failed: {type(exc).__name__}: {exc}").body())
    yield sse.DONE
