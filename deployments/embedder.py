"""Embedder deployment: a thin shell around engine.embedder.Embedder (its own small model).

Owns one embedding model per replica. Bad inputs come back as an `InvalidRequestError` value.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from engine.errors import InvalidRequestError

from ray import serve


@serve.deployment
class Embedder:
    def __init__(self, model: str | None):
        # Imported here, not at the top: only this replica's process needs MLX and the model code.
        from engine.embedder import Embedder as EngineEmbedder

        self._embedder = EngineEmbedder(model)
        # The forward blocks in MLX; one thread keeps it off the event loop and never runs two at once.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")

    async def model_name(self) -> str:
        return self._embedder.model_name

    async def embed(
        self, inputs: list[str] | list[list[int]], dimensions: int | None = None
    ) -> tuple[list[list[float]], int] | InvalidRequestError:
        """(one unit vector per input, input tokens counted), or the error that rejected the inputs."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._embedder.embed, inputs, dimensions)
        except InvalidRequestError as exc:
            return exc
