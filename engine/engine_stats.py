"""Reads a snapshot of engine state for the status and metrics endpoints; mutates nothing."""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.messages import ComputePaths, EngineStats, LiveRequestStats
from engine.models.encoder_cache import EncoderCache
from engine.prefix_offload import PrefixOffload
from engine.request_metrics import RequestMetrics
from engine.spec_decode.speculator import Speculator

import mlx.core as mx


class StatsSource(Protocol):
    """What a snapshot reads: the engine's parts and counters (engine/llm_engine.py's LLMEngine)."""

    scheduler: Scheduler
    pool: BlockPool
    kv: KVCacheManager
    metrics: RequestMetrics
    prefix_disk: PrefixOffload
    compute: ComputePaths
    speculator: Speculator | None
    encoder_cache: EncoderCache | None
    num_steps: int
    num_finished: int
    prompt_tokens_total: int
    generation_tokens_total: int
    started_s: float


def collect_stats(engine: StatsSource) -> EngineStats:
    scheduler, pool, kv = engine.scheduler, engine.pool, engine.kv
    ttft, itl, e2e, by_reason = engine.metrics.snapshot()
    return EngineStats(
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_steps=engine.num_steps,
        num_blocks_total=pool.num_blocks,
        num_blocks_free=pool.num_free,
        num_blocks_used=pool.num_used,
        block_size=kv.block_size,
        prefix_cache_queries=kv.prefix_queries,
        prefix_cache_hits=kv.prefix_hits,
        prefix_cache_disk_hits=kv.prefix_disk_hits,
        prefix_cache_disk_writes=engine.prefix_disk.num_written,
        prefix_cache_disk_writes_dropped=engine.prefix_disk.num_dropped,
        num_preemptions=scheduler.num_preemptions,
        **_spec_stats(engine.speculator),
        encoder_cache_queries=engine.encoder_cache.num_queries if engine.encoder_cache else 0,
        encoder_cache_hits=engine.encoder_cache.num_hits if engine.encoder_cache else 0,
        prompt_tokens_total=engine.prompt_tokens_total,
        generation_tokens_total=engine.generation_tokens_total,
        num_requests_finished=engine.num_finished,
        device_memory_bytes=_device_memory_bytes(),
        uptime_s=time.monotonic() - engine.started_s,
        live_requests=[_live(r) for r in list(scheduler.running) + list(scheduler.waiting)],
        time_to_first_token_s=ttft,
        inter_token_latency_s=itl,
        e2e_request_latency_s=e2e,
        num_requests_by_finish_reason=by_reason,
        compute=engine.compute,
    )


def _spec_stats(speculator: Speculator | None) -> dict[str, Any]:
    if speculator is None:
        return {}
    stats = speculator.stats
    return {
        "spec_num_drafts": stats.num_drafts,
        "spec_num_draft_tokens": stats.num_draft_tokens,
        "spec_num_accepted_tokens": stats.num_accepted_tokens,
        "spec_accepted_per_pos": list(stats.accepted_per_pos),
    }


def _live(request: Request) -> LiveRequestStats:
    phase: Literal["waiting", "prefill", "decode"]
    if request.status is RequestStatus.WAITING:
        phase = "waiting"
    else:
        phase = "prefill" if request.num_computed_tokens < request.num_prompt_tokens else "decode"
    ttft = None if request.first_token_s is None else request.first_token_s - request.arrival_s
    rate = None
    if request.first_token_s is not None and request.num_output_tokens > 1:
        elapsed = time.monotonic() - request.first_token_s
        rate = (request.num_output_tokens - 1) / elapsed if elapsed > 0 else None
    return LiveRequestStats(
        request.request_id,
        phase,
        request.num_prompt_tokens,
        request.num_output_tokens,
        request.num_cached_tokens,
        ttft,
        rate,
    )


def _device_memory_bytes() -> int:
    try:
        return int(mx.get_active_memory())
    except AttributeError:
        return 0
