"""Embedder deployment: a thin shell around engine.embedder.Embedder (its own small model).

Owns one embedding model per replica. Bad inputs come back as an `InvalidRequestError` value.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from engine.errors import InvalidRequestError

from ray import serve

_MAX_BATCH_REQUESTS = 32
_BATCH_WAIT_S = 0.005  # how long the first request of a batch waits for company


@serve.deployment
class Embedder:
    def __init__(self, model: str | None):
        # Imported here, not at the top: only this replica's process needs MLX and the model code.
        from engine.embedder import Embedder as EngineEmbedder

        self._embedder = EngineEmbedder(model)
        # The forward blocks in MLX; one thread keeps it off the event loop and never runs two at once.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self.num_batches = 0

    async def model_name(self) -> str:
        return self._embedder.model_name

    async def max_input_tokens(self) -> int:
        return self._embedder.max_input_tokens

    async def embed(
        self, inputs: list[str] | list[list[int]], dimensions: int | None = None
    ) -> tuple[list[list[float]], int] | InvalidRequestError:
        """(one unit vector per input, input tokens counted), or the error that rejected the inputs.

        Each request is validated alone, so a bad one fails alone; valid ones that arrive together
        share forwards through `_embed_batch`."""
        loop = asyncio.get_running_loop()
        try:
            token_ids = await loop.run_in_executor(self._executor, self._embedder.prepare, inputs, dimensions)
        except InvalidRequestError as exc:
            return exc
        vectors = await self._embed_batch((token_ids, dimensions))
        return vectors, sum(map(len, token_ids))

    @serve.batch(max_batch_size=_MAX_BATCH_REQUESTS, batch_wait_timeout_s=_BATCH_WAIT_S)
    async def _embed_batch(
        self, requests: list[tuple[list[list[int]], int | None]]
    ) -> list[list[list[float]]]:
        self.num_batches += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embedder.embed_prepared, requests)

    async def batch_count(self) -> int:
        """Forward batches run so far (requests that arrived together count once)."""
        return self.num_batches
