"""Scheduler deployment: one LLMEngine per replica, stepped by a background loop (deployments/step_loop.py).

Owns the replica's engine. It only receives requests, steps and sends `RequestOutput` batches;
every scheduling decision is the engine's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from engine.config import EngineConfig
from engine.errors import EngineError
from engine.messages import GenerateRequest, RequestOutput

from ray import serve

from deployments.messages import ModelInfo, ReplicaStats
from deployments.step_loop import StepLoop


@serve.deployment
class Scheduler:
    def __init__(self, engine_config: dict[str, Any], stream_interval_s: float):
        # Imported here, not at the top: only this replica's process needs MLX and the model code.
        from engine.llm_engine import LLMEngine

        self._engine = LLMEngine(EngineConfig.model_validate(engine_config))
        self._loop = StepLoop(self._engine, stream_interval_s)
        self._replica_id = serve.get_replica_context().replica_id.unique_id

    async def generate(self, request: GenerateRequest) -> AsyncIterator[list[RequestOutput] | EngineError]:
        """Call through a streaming handle: `list[RequestOutput]` batches, or one `EngineError` if
        the engine rejected the request. Cancelling the call aborts the request and frees its blocks."""
        async with aclosing(self._loop.generate(request)) as items:  # closing this closes the inner one
            async for item in items:
                yield item

    async def model_info(self) -> ModelInfo:
        eos_ids = sorted(self._engine.tokenizer.eos_token_ids)
        return ModelInfo(self._engine.model_name, self._engine.max_model_len, eos_ids)

    async def stats(self) -> ReplicaStats:
        """This replica's engine stats; the Ingress broadcasts this to every replica and adds them up."""
        return ReplicaStats(self._replica_id, await self._loop.stats())
