"""Plain data that crosses the engine boundary (and so the Scheduler actor boundary).

The engine receives `GenerateRequest`s and emits `RequestOutput` deltas. No MLX arrays, no live
objects: every field is a builtin, one of these dataclasses or (image pixels) a NumPy array, so Ray
pickles them cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class StructuredOutputs:
    """Constrains a request's output token by token (engine/output/structured_output.py). Exactly one field is set."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    grammar: str | None = None  # a Lark grammar in llguidance's dialect; it may embed %json{...} schemas
    # The request field it came from ("text.format", "guided_regex", ...): errors about it name this.
    # None: "grammar" for a grammar, else "response_format".
    param: str | None = None


@dataclass
class SamplingParams:
    """Per-request sampling; `None` means the feature is off. Validated by `engine.sampler.validate_params`."""

    max_tokens: int | None = None  # None: up to the model's context length
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k >= 0: sampled token's logprob plus the top k
    skip_special_tokens: bool = True
    structured: StructuredOutputs | None = None


@dataclass
class ImageInputs:
    """A request's images as the model's processor prepared them (engine/prompt/image_processor.py): NumPy
    arrays, never MLX ones, so they pickle across actors. The prompt's image tokens are already expanded."""

    pixel_values: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. pixel_attention_mask, image_grid_thw
    image_hash: str = ""  # sha256 over every image's bytes, in prompt order: keys the prefix cache
    num_images: int = 0


@dataclass
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    images: ImageInputs | None = None  # only for a vision-language model
    n: int = 1  # parallel samples of the one prompt (engine/core/parallel_sampling.py); outputs carry `index`


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token_id, logprob), best first


@dataclass
class RequestOutput:
    """What changed for one request since its previous output."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the matched stop string or stop token id
    logprobs: list[TokenLogprob] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None
    error_param: str | None = None  # set when the failure is the request's: the parameter to change (a 400)
    index: int = 0  # which of the request's `n` samples this output belongs to

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class LiveRequestStats:
    request_id: str
    phase: Literal["waiting", "prefill", "decode"]
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    ttft_s: float | None
    tokens_per_s: float | None


@dataclass
class Histogram:
    """Observations per bucket, Prometheus-style: `counts[i]` fell in (bounds[i-1], bounds[i]]; the
    last count is the +Inf bucket, so `len(counts) == len(bounds) + 1`. Not cumulative."""

    bounds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=lambda: [0])
    sum: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def merged(self, other: Histogram) -> Histogram:
        """Both histograms' observations. One with no bounds is empty (a default) and adopts the other's."""
        if not other.bounds:
            return Histogram(list(self.bounds), list(self.counts), self.sum)
        if not self.bounds:
            return Histogram(list(other.bounds), list(other.counts), other.sum)
        assert self.bounds == other.bounds, "replicas must share bucket bounds"
        counts = [a + b for a, b in zip(self.counts, other.counts)]
        return Histogram(list(self.bounds), counts, self.sum + other.sum)


@dataclass(frozen=True)
class ComputePaths:
    """How one engine runs its model, fixed at load by engine/runner/backends.py: what to check first
    when a replica is slow. A fast path that cannot serve the model falls back to a slower one, and
    `not_taken` says why for each."""

    device: str  # MLX's device: "cpu" or "gpu"
    dtype: str  # of the weights and the KV cache
    blas: str  # engine/platform/blas.py: "openblas", "custom", "reference" (~30x slower matmuls) or "native"
    blas_detail: str  # how it was loaded, or why not
    blas_config: str | None  # OpenBLAS's build: version, DYNAMIC_ARCH, MAX_THREADS; None: not OpenBLAS
    blas_core: str | None  # the kernels OpenBLAS chose for this CPU (Haswell, SkylakeX, NeoverseN1, ...)
    decode: str  # "c_forward", "cuda_fused", "cuda_graph" or "mlx" (the model's own call over paged caches)
    attention: str  # batched decode attention: "window_attention" (K/V read in place) or "gather"
    math: str  # softmax and SwiGLU: "cpu_math" or "mlx"
    prefill: str  # "paired_prefill" (two chunks on two CPU streams) or "one_at_a_time"
    kv_write: str  # who writes new K/V into the pools, for decode rows and prefill chunks
    not_taken: dict[str, str] = field(default_factory=dict)  # fast path -> why it does not serve
    # The model's caches (engine/runner/layer_caches.py): what each layer keeps per request.
    cache_layers: str = ""  # e.g. "kv x2, state x2", "kv x3, window 8 x1"
    decode_rows: str = "batched"  # or "one per forward: <why the model cannot take a batch>"
    prefix_cache: str = "on"  # or "off: <why>"
    state_bytes_per_seq: int = 0  # recurrent/SSM/conv state each running request holds, in the KV budget
    num_state_slots: int = 0  # requests that can hold such state at once (max_num_seqs)
    # A vision-language model's inputs and encoder cache (engine/models/vision_model.py); "" for text.
    vision: str = ""
    # The paged KV cache (engine/runner/kv_storage.py): how it stores K/V, and what the budget holds.
    kv_cache_dtype: str = "auto"  # "auto" (the model's dtype), "int8" or "int4" (engine/runner/kv_quant.py)
    kv_bytes_per_token: int = 0  # every layer's K and V of one token, scales and biases included
    kv_capacity_tokens: int = 0  # tokens the pool holds: num_blocks * block_size, over all requests
    speculative: str = "off"  # e.g. "ngram, 4 tokens (lookup 2-4)" (engine/spec_decode/)
    sampling: str = "host"  # "device" (engine/output/device_sampler.py) or "host" (engine/output/sampler.py)
    # 4-bit products of 2-128 rows on CUDA (engine/runner/cuda/quantized_rows.py): "N of M quantized
    # products" (and why the others keep MLX's), or "off".
    quantized_rows: str = "off"
    # Float32 layer weights the CPU's C forward reads in an exact smaller form
    # (engine/runner/cpu/exact_pack.py): what it packed and the bytes read, or "off" and why.
    weight_packing: str = "off"
    # The CPU's C forward's many-row products (engine/runner/cpu/onednn.py): "oneDNN <kernel> (...)" or
    # "sgemm" and why.
    prefill_matmul: str = "sgemm"
    # The C forward's many-row products of 4-bit weights on Intel AMX (engine/runner/cpu/amx.py):
    # "AMX bfloat16 x3 over N 4-bit products (...)", or "off" and why.
    amx_matmul: str = "off"
    # The process's nice value at load. Ray starts its workers at 15 unless RAY_worker_niceness=0 is set
    # where the cluster starts (the README's start does): above 0, every busy thread of another process
    # at 0, Ray's own among them, runs before the engine's.
    niceness: int = 0


@dataclass
class EngineStats:
    """A snapshot for the status and metrics endpoints; counters are totals since start."""

    num_running: int = 0
    num_waiting: int = 0
    num_steps: int = 0
    num_blocks_total: int = 0
    num_blocks_free: int = 0
    num_blocks_used: int = 0
    block_size: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # prompt tokens found, in RAM or in the disk tier
    prefix_cache_disk_hits: int = 0  # of them, found in the disk tier (engine/core/prefix_disk.py)
    prefix_cache_disk_writes: int = 0  # KV blocks written to the disk tier
    prefix_cache_disk_writes_dropped: int = 0  # blocks not written: the writer's queue was full
    num_preemptions: int = 0
    # Speculative decoding (engine/spec_decode/), as vLLM's vllm:spec_decode_* counters.
    spec_num_drafts: int = 0  # verified rows that carried drafts
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)  # [i]: rows whose draft i was kept
    encoder_cache_queries: int = 0  # vision requests whose image features were looked up
    encoder_cache_hits: int = 0  # of them, found (the vision tower did not run)
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_requests_finished: int = 0
    device_memory_bytes: int = 0
    uptime_s: float = 0.0
    live_requests: list[LiveRequestStats] = field(default_factory=list)
    # Latencies and finishes since start, recorded as they happen by engine/request_metrics.py.
    time_to_first_token_s: Histogram = field(default_factory=Histogram)
    inter_token_latency_s: Histogram = field(default_factory=Histogram)
    e2e_request_latency_s: Histogram = field(default_factory=Histogram)
    num_requests_by_finish_reason: dict[str, int] = field(default_factory=dict)
    compute: ComputePaths | None = None  # per replica; a total over replicas has none
