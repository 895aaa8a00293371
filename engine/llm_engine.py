"""The engine: requests in, `RequestOutput` deltas out, one `step()` at a time. No Ray.

Owns the scheduler, the model runner, the sampler and the output processor. `add_request` and
`abort_request` are thread-safe (they only queue); `step` must be called from one thread at a time.
A failure inside a step fails the requests it touched, never the engine.
"""

from __future__ import annotations

import logging
import os
import queue
import time

from engine.block_pool import BlockPool
from engine.config import EngineConfig
from engine.engine_stats import collect_stats
from engine.errors import ContextLengthExceededError, InvalidRequestError, QueueFullError
from engine.kv_cache_manager import KVCacheManager
from engine.messages import EngineStats, GenerateRequest, RequestOutput
from engine.model_loader import load_model
from engine.model_runner import ModelRunner, probe_layer_shapes
from engine.output_processor import OutputProcessor
from engine.paged_attention import KVStorage
from engine.request import Request
from engine.request_metrics import RequestMetrics
from engine.sampler import Sampler, SamplingRow, validate_params
from engine.scheduler import Scheduler, SchedulerPlan

import mlx.core as mx

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        loaded = load_model(config)
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = set(loaded.tokenizer.eos_token_ids)
        self.vocab_size = _vocab_size(loaded)
        shapes = probe_layer_shapes(loaded.model)
        num_blocks = _num_blocks(config, shapes, loaded.dtype)
        self.max_model_len = _max_model_len(config, loaded.context_len, num_blocks)
        self.storage = KVStorage(shapes, num_blocks, config.block_size, loaded.dtype)
        self.pool = BlockPool(num_blocks)
        self.kv = KVCacheManager(self.pool, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(loaded.model, self.storage)
        self.sampler = Sampler(config.seed)
        self.outputs = OutputProcessor(loaded.tokenizer, self.eos_token_ids)
        # Two inboxes, so the waiting-queue bound counts new requests and never pending aborts.
        self._new: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self.num_steps = 0
        self.num_finished = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.metrics = RequestMetrics()
        self.started_s = time.monotonic()

    # ---- thread-safe entry points -------------------------------------------------------------

    def add_request(self, request: GenerateRequest) -> None:
        """Validates at once (raising a typed error) and queues the request for the next step."""
        params = request.params
        validate_params(params, self.vocab_size)
        num_prompt = len(request.prompt_token_ids)
        self._check_prompt(request.prompt_token_ids)
        room = self.max_model_len - num_prompt
        if params.max_tokens is not None and params.max_tokens > room:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{num_prompt + params.max_tokens} tokens ({num_prompt} in the messages, {params.max_tokens} "
                "in the completion). Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        bound = self.config.max_waiting_requests
        if bound is not None and len(self.scheduler.waiting) + self._new.qsize() >= bound:
            raise QueueFullError(f"the waiting queue is full ({bound} requests); retry later")
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        self._new.put(Request(request.request_id, list(request.prompt_token_ids), params, max_tokens))

    def abort_request(self, request_id: str) -> None:
        self._aborts.put(request_id)

    # ---- the step -----------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or not self._new.empty() or not self._aborts.empty()

    def step(self) -> list[RequestOutput]:
        outputs = self._drain_inbox()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return outputs
        self.num_steps += 1
        try:
            sampled, logprobs = self._run(plan)
        except Exception as exc:
            logger.exception("step failed")
            return outputs + self._fail([s.request for s in plan.scheduled], f"step failed: {exc}")
        for request, token_id in self.scheduler.update(plan, sampled):
            self.generation_tokens_total += 1
            self.metrics.on_token(request)
            output = self.outputs.process(request, [token_id], logprobs.get(request.request_id, []))
            if output.finished:
                self._finish(request)
            outputs.append(output)
        return outputs

    def _run(self, plan: SchedulerPlan) -> tuple[dict[str, int], dict[str, list]]:
        step = self.runner.execute(plan)
        rows = [
            SamplingRow(
                s.request.params, s.request.prompt_token_ids, s.request.output_token_ids, self.eos_token_ids
            )
            for s in step.items
        ]
        result = self.sampler.sample(step.logits, rows)
        ids = [s.request.request_id for s in step.items]
        sampled = dict(zip(ids, result.token_ids))
        logprobs = {rid: [lp] for rid, lp in zip(ids, result.logprobs) if lp is not None}
        return sampled, logprobs

    def _drain_inbox(self) -> list[RequestOutput]:
        while not self._new.empty():
            request = self._new.get()
            self._requests[request.request_id] = request
            self.prompt_tokens_total += request.num_prompt_tokens
            self.outputs.add(request)
            self.scheduler.add(request)
        outputs = []
        while not self._aborts.empty():
            if (request := self._requests.get(self._aborts.get())) is not None:
                outputs.append(self.outputs.abort(request, "abort"))
                self._finish(request)
        return outputs

    def _fail(self, requests: list[Request], error: str) -> list[RequestOutput]:
        outputs = []
        for request in requests:
            if request.request_id in self._requests:
                outputs.append(self.outputs.abort(request, "error", error))
                self._finish(request)
        return outputs

    def _finish(self, request: Request) -> None:
        self.scheduler.finish(request)
        self._requests.pop(request.request_id, None)
        self.num_finished += 1
        self.metrics.on_finish(request)

    def _check_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; send at least one token", param="prompt")
        if len(token_ids) >= self.max_model_len:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                f"{len(token_ids)} tokens, leaving no room for the completion. Please shorten the prompt.",
                param="messages",
            )
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", "prompt"
            )

    def stats(self) -> EngineStats:
        return collect_stats(self)


def _vocab_size(loaded) -> int:
    args = getattr(loaded.model, "args", None)
    size = getattr(args, "vocab_size", None)
    return size if isinstance(size, int) else len(loaded.tokenizer.get_vocab())


def _total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _num_blocks(config: EngineConfig, shapes, dtype: mx.Dtype) -> int:
    budget = config.kv_cache_memory_bytes or int(config.kv_cache_memory_fraction * _total_memory_bytes())
    per_block = KVStorage.bytes_per_block(shapes, config.block_size, dtype)
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV budget of {budget} bytes holds no {per_block}-byte block; raise kv_cache_memory_bytes"
        )
    return num_blocks


def _max_model_len(config: EngineConfig, context_len: int | None, num_blocks: int) -> int:
    capacity = num_blocks * config.block_size
    if config.max_model_len is not None:
        if context_len is not None and config.max_model_len > context_len:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's {context_len}; lower it or pick another model"
            )
        if config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the KV cache's {capacity} tokens; "
                "raise kv_cache_memory_bytes or lower max_model_len"
            )
        return config.max_model_len
    return min(context_len or capacity, capacity)
