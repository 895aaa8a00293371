"""Scheduler deployment: one LLMEngine per replica, stepped by a background loop (deployments/step_loop.py).

Owns the replica's engine. It only receives requests, steps and sends `RequestOutput` batches;
every scheduling decision is the engine's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from engine.config import EngineConfig
from engine.errors import EngineError
from engine.messages import GenerateRequest, RequestOutput

from ray import serve

from deployments.messages import Admitted, ChannelRequest, ModelInfo, ReplicaStats
from deployments.ray_metrics import RayMetricsExporter
from deployments.step_loop import HEARTBEAT_S, StepLoop

logger = logging.getLogger(__name__)
# Ray Serve writes this logger's records to the replica's log file and the dashboard's log view.
serve_logger = logging.getLogger("ray.serve")

METRICS_EXPORT_INTERVAL_S = 5.0  # Ray's metrics agent reports every few seconds too
SHUTDOWN_FLUSH_S = 30.0  # bound on the disk tier's last writes at shutdown: a hung step must not hang it


@serve.deployment
class Scheduler:
    def __init__(
        self,
        engine_config: dict[str, Any],
        stream_interval_s: float,
        max_stream_batches_per_s: float | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        expect_images: bool = False,
    ):
        # Imported here, not at the top: only this replica's process needs MLX and the model code.
        from engine.llm_engine import LLMEngine

        config = EngineConfig.model_validate(engine_config)
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        # Built on the thread that will step it (deployments/step_loop.py: MLX's GPU streams are per thread).
        self._loop = StepLoop.building(
            lambda: LLMEngine(config),
            stream_interval_s,
            max_stream_batches_per_s,
            heartbeat_s,
            self._replica_id,
        )
        self._engine: LLMEngine = self._loop.engine
        if expect_images and not self._engine.accepts_images:
            raise ValueError(
                f"{config.model} takes no images, but its models entry says kind: vision; "
                "set kind: text, or serve a vision-language model (docs/vision.md)"
            )
        model_name = config.served_model_name or self._engine.model_name
        self._ray_metrics = RayMetricsExporter(model_name, self._replica_id)
        self._export_task: asyncio.Task[None] | None = None
        serve_logger.info("engine for %s loaded: %s", model_name, self._engine.compute)
        if self._engine.compute.niceness > 0:
            serve_logger.warning(
                "this replica runs at nice %d (Ray's default for its workers), so the busy threads of "
                "other processes, Ray's own among them, run before the engine's: start `serve run` with "
                "RAY_worker_niceness=0 (the README's start) to run it at 0",
                self._engine.compute.niceness,
            )

    async def generate(
        self, request: GenerateRequest, channel_id: str | None = None
    ) -> AsyncIterator[list[RequestOutput] | Admitted | EngineError]:
        """Call through a streaming handle: `list[RequestOutput]` batches (empty ones say "admitted"
        and "still waiting"; deployments/step_loop.py), or one `EngineError` if the engine rejected
        the request. With the `channel_id` of an output channel open on this replica, the outputs go
        there instead. Cancelling the call aborts the request and frees its blocks."""
        self._ensure_exporting()
        async with aclosing(self._loop.generate(request, channel_id)) as items:  # closing closes the inner
            async for item in items:
                yield item

    async def output_channel(self, request: ChannelRequest) -> AsyncIterator[str | list[RequestOutput]]:
        """Call through a streaming handle, routed to `request.replica_id` (deployments/prefix_router.py):
        this replica's id, then the outputs of the caller's requests that name the channel, gathered,
        until the caller cancels the call (deployments/inbox.py)."""
        async with aclosing(self._loop.channel(request.channel_id)) as items:
            async for item in items:
                yield item

    async def model_info(self) -> ModelInfo:
        eos_ids = sorted(self._engine.tokenizer.eos_token_ids)
        accepts_images = self._engine.accepts_images
        return ModelInfo(self._engine.model_name, self._engine.max_model_len, eos_ids, accepts_images)

    async def stats(self) -> ReplicaStats:
        """This replica's engine stats; the Ingress broadcasts this to every replica and adds them up."""
        return ReplicaStats(self._replica_id, await self._loop.stats(), self._loop.num_output_channels)

    def _ensure_exporting(self) -> None:
        # Started on the first request: the constructor may run outside the replica's event loop.
        if self._export_task is None or self._export_task.done():
            self._export_task = asyncio.get_running_loop().create_task(self._export_forever())

    def __del__(self) -> None:
        # Ray Serve calls this when it stops the replica: blocks still owed to the prefix cache's disk
        # tier are saved, so the next replica finds them.
        loop = getattr(self, "_loop", None)  # None: the constructor failed
        if loop is not None:
            try:
                loop.run_between_steps(self._engine.close, timeout_s=SHUTDOWN_FLUSH_S)
                loop.stop(timeout_s=SHUTDOWN_FLUSH_S)
            except TimeoutError:
                logger.warning(
                    "the engine's last step outlasted %.0f s; closing without it", SHUTDOWN_FLUSH_S
                )
            except RuntimeError:  # the step loop is stopped already: nothing to flush
                pass

    async def _export_forever(self) -> None:
        """Exports the engine's stats to Ray's metrics until the step loop stops (__del__)."""
        while not self._loop.stopped:
            try:
                self._ray_metrics.export(await self._loop.stats())
            except Exception:
                if self._loop.stopped:  # stopped while the stats were asked for: shutting down
                    return
                logger.exception("exporting Ray metrics failed; retrying")
            await asyncio.sleep(METRICS_EXPORT_INTERVAL_S)
