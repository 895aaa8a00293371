"""The engine: requests in, `RequestOutput` deltas out, one `step()` at a time. No Ray.

Owns the scheduler, the model runner, the sampler and the output processor. `add_request` and
`abort_request` are thread-safe (they only queue); `step` must be called from one thread at a time.
A failure inside a step fails the requests it touched, never the engine.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import replace

from engine import kv_budget
from engine.config import EngineConfig
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.parallel_sampling import ParallelSampling, check_n, sample_id, sample_params
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, Scheduler
from engine.core.state_slots import StateSlots
from engine.core.vision_state import vision_state
from engine.engine_stats import collect_stats
from engine.errors import ContextLengthExceededError, InvalidRequestError, QueueFullError
from engine.messages import EngineStats, GenerateRequest, RequestOutput
from engine.models.model_loader import load_model
from engine.output.output_processor import OutputProcessor, merge_outputs
from engine.output.sampler import samples_on_device, validate_params
from engine.output.step_sampler import Sampled, StepSampler
from engine.output.structured_output import StructuredOutputManager
from engine.prefix_offload import PrefixOffload
from engine.request_metrics import RequestMetrics
from engine.runner import backends
from engine.runner.batch_probe import probe_batching
from engine.runner.fast_path import Target
from engine.runner.kv_storage import KVStorage
from engine.runner.layer_caches import LayerCaches
from engine.runner.model_head import split_head
from engine.runner.model_runner import DeviceTokens, ModelRunner, StepLogits
from engine.runner.state_storage import StateStorage
from engine.spec_decode import setup as spec_setup
from engine.spec_decode.speculator import Speculator

import mlx.core as mx

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        loaded = load_model(config)
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = set(loaded.tokenizer.eos_token_ids)
        self.image_token_id = loaded.image_token_id  # None: a text-only model, or one that names none
        self.accepts_images = loaded.accepts_images
        self.encoder_cache = getattr(
            loaded.model, "encoder_cache", None
        )  # a vision model's, where it applies
        self.vocab_size = _vocab_size(loaded)
        layers = LayerCaches(loaded.model)
        shapes, state_shapes = layers.probe_shapes()
        probe_batching(layers, shapes, state_shapes, loaded.dtype, config.block_size)
        # Recurrent layers keep one state per request (a slot per running request), and a cached
        # prefix's blocks would not bring that state back: such a model's prefix cache is off.
        self.states = StateStorage(state_shapes, config.max_num_seqs) if layers.has_state else None
        state_bytes = self.states.nbytes if self.states is not None else 0
        self.prefill_whole = getattr(loaded.model, "whole_prompt", False)
        self.prefix_caching_off = _prefix_caching_off(config, layers, self.prefill_whole)
        if config.speculative is not None:
            spec_setup.check_target(config, layers)
        draft = spec_setup.load_draft(config, loaded.tokenizer.get_vocab())
        draft_bytes = draft.bytes_per_block(config) if draft is not None else 0
        num_blocks = kv_budget.num_blocks(
            config, shapes, loaded.dtype, state_bytes, loaded.context_len, draft_bytes
        )
        self.max_model_len = kv_budget.max_model_len(config, loaded.context_len, num_blocks)
        self.storage = KVStorage(shapes, num_blocks, config.block_size, loaded.dtype, config.kv_cache_dtype)
        self.pool = BlockPool(num_blocks)
        slots = StateSlots(config.max_num_seqs) if self.states is not None else None
        prefix_caching = config.enable_prefix_caching and self.prefix_caching_off is None
        self.kv = KVCacheManager(self.pool, config.block_size, prefix_caching, slots)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.prefix_disk = PrefixOffload.build(config, self.kv, self.storage)  # a no-op when off
        target = Target(loaded.model, self.storage, loaded.device, split_head(loaded.model))
        self.runner = ModelRunner(backends.choose(target, config), layers, self.states)
        device_sampling = _on_gpu_unless_set(config.device_sampling, loaded.device)
        self.compute = replace(
            self.runner.compute_paths(),
            cache_layers=layers.kinds_summary,
            decode_rows="batched" if layers.batched_decode else f"one per forward: {layers.unbatched_reason}",
            prefix_cache="on" if self.prefix_caching_off is None else f"off: {self.prefix_caching_off}",
            state_bytes_per_seq=StateStorage.bytes_per_slot(state_shapes),
            num_state_slots=self.states.num_slots if self.states is not None else 0,
            vision=getattr(loaded.model, "summary", ""),
            kv_cache_dtype=config.kv_cache_dtype,
            kv_bytes_per_token=self.storage.bytes_per_token,
            kv_capacity_tokens=num_blocks * config.block_size,
            speculative=spec_setup.describe(config),
            sampling="device" if device_sampling else "host",
        )
        logger.info("%s compute paths: %s", self.model_name, self.compute)
        self.speculator: Speculator | None = None
        if config.speculative is not None:
            draft_model = (
                spec_setup.build_draft(draft, config, num_blocks, self.vocab_size) if draft else None
            )
            self.speculator = Speculator(
                config.speculative, self.max_model_len, self.eos_token_ids, draft_model, config.seed
            )
        self.structured = StructuredOutputManager(loaded.tokenizer)
        self.sampler = StepSampler(config.seed, self.eos_token_ids, self.structured, device_sampling)
        self.outputs = OutputProcessor(loaded.tokenizer, self.eos_token_ids, self.structured)
        # Two inboxes, so the waiting-queue bound counts new requests and never pending aborts.
        self._new: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self.parallel = ParallelSampling(hold_back=prefix_caching)  # n > 1 requests
        self._in_flight: DeviceTokens | None = None  # a launched step whose tokens are not read yet
        # Drafting needs each step's tokens read before the next step is built: no async with it.
        self.async_scheduling = config.speculative is None and _on_gpu_unless_set(
            config.async_scheduling, loaded.device
        )
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
        check_n(request.request_id, request.n)
        validate_params(params, self.vocab_size)
        self.structured.validate(params.structured)
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
        num_queued = len(self.scheduler.waiting) + self._new.qsize() + self.parallel.num_held
        if bound is not None and num_queued + request.n > bound:  # each of n samples is one request
            raise QueueFullError(f"the waiting queue is full ({bound} requests); retry later")
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        samples = [self._sample(request, i, max_tokens) for i in range(request.n)]
        for sample in samples:  # in index order: sample 0 reaches the inbox first
            self._new.put(sample)

    def _sample(self, request: GenerateRequest, index: int, max_tokens: int) -> Request:
        """The engine request of sample `index`; with n > 1 it runs under its own id (parallel_sampling)."""
        vision = vision_state(
            request.prompt_token_ids, request.images, self.accepts_images, self.image_token_id
        )
        prompt, params = list(request.prompt_token_ids), sample_params(request.params, index)
        whole = self.prefill_whole
        if request.n == 1:
            return Request(request.request_id, prompt, params, max_tokens, vision=vision, prefill_whole=whole)
        rid = sample_id(request.request_id, index)
        return Request(
            rid,
            prompt,
            params,
            max_tokens,
            vision=vision,
            parent_id=request.request_id,
            index=index,
            prefill_whole=whole,
        )

    def abort_request(self, request_id: str) -> None:
        self._aborts.put(request_id)

    # ---- the step -----------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return (
            self.scheduler.has_unfinished()
            or self._in_flight is not None
            or not self._new.empty()
            or not self._aborts.empty()
            or self.parallel.num_held > 0
        )

    def step(self) -> list[RequestOutput]:
        """Schedules and launches one step, then reads the previous launched step's tokens.

        When every row of a step samples plain greedy, its tokens stay on the device (`_in_flight`)
        and the next step is built and launched before they are read, so the host's work overlaps
        the device's. Any other step samples on the host at once, as before. With device sampling,
        every row samples on the device and sampled rows may stay there too (`_sample_on_device`)."""
        outputs = self._drain_inbox()
        self.prefix_disk.save_new_blocks()  # before schedule() may hand their block ids out again
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        plan = self.scheduler.schedule()
        self.prefix_disk.load_hits()  # disk hits' KV, in place before the model reads it
        if plan.is_empty:
            return outputs + self._read_in_flight()
        self.num_steps += 1
        try:
            self.structured.prepare(plan.scheduled)  # grammar masks fill while the model runs
            if self.speculator is not None:
                self.speculator.fill(plan.scheduled)
            step = self.runner.execute(plan, self._in_flight)
        except Exception as exc:  # noqa: BLE001  (_fail_step logs the traceback)
            outputs += self._read_in_flight()  # the previous step's tokens are good: commit them first
            return outputs + self._fail_step([s.request for s in plan.scheduled], exc)
        self.scheduler.advance(plan)
        if not step.items and not step.spec_items:  # prefill chunks that do not reach a prompt's end
            return outputs + self._read_in_flight()
        chosen = step.token_ids is not None  # the forward chose greedy tokens itself: read them now
        if self.sampler.on_device and step.items and not chosen:
            return outputs + self._sample_on_device(step) + self._verify_drafts(step)
        on_device = all(samples_on_device(s.request) for s in step.items)
        if self.async_scheduling and on_device and not step.spec_items and not chosen:
            launched = DeviceTokens(step.items, mx.argmax(step.logits, axis=-1).astype(mx.int32))
            mx.async_eval(launched.token_ids)
            outputs += self._read_in_flight()
            self._in_flight = launched
            return outputs
        outputs += self._read_in_flight()  # host sampling wants every earlier token committed
        outputs += self._sample_on_host(step) if step.items else []
        return outputs + self._verify_drafts(step)

    def _verify_drafts(self, step: StepLogits) -> list[RequestOutput]:
        """Rows with drafts emit the drafts the model kept and one token of its own, committed one by one
        as plain decoding would, so stops land on the same token; one merged output per request."""
        outputs = []
        for item, logits in zip(step.spec_items, step.spec_logits):
            request = item.request
            if request.is_finished:
                continue
            assert self.speculator is not None
            try:
                mx.eval(logits)
                token_ids = self.speculator.verify(item, logits)
            except Exception as exc:  # noqa: BLE001  (_fail_step logs the traceback)
                outputs += self._fail_step([request], exc, "verification")
                continue
            self.scheduler.settle_drafts(request, len(token_ids) - 1)
            emitted: list[RequestOutput] = []
            for token_id in token_ids:
                if request.is_finished:  # a stop on an earlier token: the rest are not emitted
                    break
                emitted += self._commit([item], {request.request_id: token_id}, {})
            outputs.append(merge_outputs(emitted))
        return outputs

    def _sample_on_host(self, step: StepLogits) -> list[RequestOutput]:
        return self._apply(self.sampler.on_host(step))

    def _sample_on_device(self, step: StepLogits) -> list[RequestOutput]:
        """Every row samples on the device. With async scheduling, rows that need nothing of their pending
        tokens but their number stay there (`_in_flight`) and are read with the next step, as greedy rows
        are; the others (penalties, structured output) are read now."""
        launch = self.sampler.launch(step, pipeline=self.async_scheduling and not step.spec_items)
        outputs = self._read_in_flight()  # the previous step's, while the device samples this one
        self._in_flight = launch.later
        return outputs + self._apply(self.sampler.read_now(launch))

    def _read_in_flight(self) -> list[RequestOutput]:
        launched, self._in_flight = self._in_flight, None
        if launched is None:
            return []
        return self._apply(self.sampler.read(launched))

    def _apply(self, sampled: Sampled) -> list[RequestOutput]:
        """Fails the requests whose sampling raised, then commits the others' tokens."""
        outputs = []
        for requests, exc, stage in sampled.failed:
            outputs += self._fail_step(requests, exc, stage)
        return outputs + self._commit(sampled.items, sampled.token_ids, sampled.logprobs)

    def _commit(
        self, items: list[ScheduledRequest], sampled: dict[str, int], logprobs: dict[str, list]
    ) -> list[RequestOutput]:
        outputs = []
        for item in items:
            request = item.request
            if request.is_finished:  # aborted, or stopped, after its step was launched
                continue
            token_id = sampled[request.request_id]
            self.scheduler.commit(request, token_id)
            self.generation_tokens_total += 1
            self.metrics.on_token(request)
            output = self.outputs.process(request, [token_id], logprobs.get(request.request_id, []))
            if output.finished:
                self._finish(request)
            outputs.append(output)
        return outputs

    def _drain_inbox(self) -> list[RequestOutput]:
        while not self._new.empty():
            if self.parallel.arrive(request := self._new.get()):
                self._admit(request)
        for request in self.parallel.release():  # their sample 0's prompt blocks are cached by now
            self._admit(request)
        outputs = []
        while not self._aborts.empty():
            outputs += self._abort(self._aborts.get())
        return outputs

    def _admit(self, request: Request) -> None:
        self._requests[request.request_id] = request
        self.prompt_tokens_total += request.num_prompt_tokens
        self.outputs.add(request)
        self.scheduler.add(request)

    def _abort(self, request_id: str) -> list[RequestOutput]:
        """Aborts a request, or every sample of an n > 1 one (held-back ones are admitted first)."""
        held, samples = self.parallel.abort(request_id)
        for request in held:
            self._admit(request)
        outputs = []
        for rid in [s.request_id for s in samples] or [request_id]:
            if (found := self._requests.get(rid)) is not None:
                outputs.append(self.outputs.abort(found, "abort"))
                self._finish(found)
        return outputs

    def _fail_step(self, requests: list[Request], exc: Exception, stage: str = "step") -> list[RequestOutput]:
        """Fails `requests` for `exc`, logging its traceback once with their ids: the request's error
        carries only the message, so the log is where an operator finds where it broke."""
        ids = ", ".join(r.request_id for r in requests)
        logger.error("%s failed for request(s) %s", stage, ids, exc_info=exc)
        return self._fail(requests, f"{stage} failed: {type(exc).__name__}: {exc}")

    def _fail(self, requests: list[Request], error: str) -> list[RequestOutput]:
        outputs = []
        for request in requests:
            if request.request_id in self._requests:
                outputs.append(self.outputs.abort(request, "error", error))
                self._finish(request)
        return outputs

    def _finish(self, request: Request) -> None:
        self.scheduler.finish(request)
        self.parallel.finish(request)
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
        # A VLM's image placeholder may lie outside the vocabulary (LLaVA-style -200): its features replace it.
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size and t != self.image_token_id), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", "prompt"
            )

    def stats(self) -> EngineStats:
        return collect_stats(self)

    def close(self) -> None:
        """Saves the blocks still owed to the prefix cache's disk tier and stops its writer: the last
        call on an engine, from the thread that steps it (deployments/scheduler.py, at shutdown)."""
        self.prefix_disk.close()


def _on_gpu_unless_set(configured: bool | None, device: str) -> bool:
    return configured if configured is not None else device == "gpu"


def _vocab_size(loaded) -> int:
    args = getattr(loaded.model, "args", None)
    size = getattr(args, "vocab_size", None)
    return size if isinstance(size, int) else len(loaded.tokenizer.get_vocab())


def _prefix_caching_off(config: EngineConfig, layers: LayerCaches, prefill_whole: bool) -> str | None:
    """Why the prefix cache is off for this model, or None."""
    if not config.enable_prefix_caching:
        return "engine.enable_prefix_caching is false"
    if prefill_whole:
        return "the prompt attends bidirectionally: a prefix's K/V depends on the tokens after it"
    if layers.has_state:
        return (
            "the model has recurrent layers: their state after a prefix is not in its KV blocks, "
            "and snapshots per block are not kept"
        )
    return None
