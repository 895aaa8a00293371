"""The one place that picks how a model runs on its device: its decode, attention, math and prefill paths.

Owns the list of fast paths and the choice. Each fast path is a plug-in in its device's folder
(engine/runner/cpu/, engine/runner/cuda/) that says at load whether it applies to this model on this
device and, if not, why (engine/runner/fast_path.py). Within a role the first path that applies and
builds serves; every other one is recorded with why not, for /v1/status and the load log. Downstream,
the model runner and the paged cache receive what was picked and never ask which device they are on.

    role       paths, in order of preference                 when none serves
    decode     cuda_fused, cuda_graph (GPU), c_forward (CPU)  the model's own call over paged caches
    math       cpu_math (CPU)                                 MLX's softmax and SwiGLU
    attention  window_attention (CPU)                         every row's context gathered
    prefill    c_forward (the decode path's rows), paired_prefill (CPU)   one chunk at a time
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from engine.config import EngineConfig
from engine.messages import ComputePaths
from engine.platform.blas import blas_state
from engine.runner.cpu.activation_hook import CpuMath
from engine.runner.cpu.cpu_decode import CForwardDecode
from engine.runner.cpu.paired_prefill import PairedPrefill, PairedPrefillPath
from engine.runner.cpu.window_attention import InPlaceWindows
from engine.runner.cuda.decode_graph import CudaGraphDecode
from engine.runner.cuda.fused_decode import CudaFusedDecode
from engine.runner.fast_path import DecodePath, FastPath, Target
from engine.runner.paged_attention import AttentionPaths

FAST_PATHS: list[FastPath] = [
    CudaFusedDecode(),
    CudaGraphDecode(),
    CForwardDecode(),
    CpuMath(),
    InPlaceWindows(),
    PairedPrefillPath(),
]
PORTABLE = {"decode": "mlx", "math": "mlx", "attention": "gather", "prefill": "one_at_a_time"}
# A decode graph runs its own kernels and attention: the eager paths' hooks would only slow it.
_GRAPH_ONLY = {"cuda_fused", "cuda_graph"}


@dataclass
class Choice:
    """What a ModelRunner runs with; `names` and `not_taken` are what /v1/status shows."""

    target: Target
    names: dict[str, str] = field(default_factory=lambda: dict(PORTABLE))  # role -> path
    built: dict[str, Any] = field(default_factory=dict)  # role -> the built fast path
    not_taken: dict[str, str] = field(default_factory=dict)  # fast path -> why it does not serve

    @property
    def decode(self) -> DecodePath | None:
        return self.built.get("decode")

    @property
    def paired(self) -> PairedPrefill | None:
        return self.built.get("prefill")

    @property
    def attention(self) -> AttentionPaths:
        math = self.built.get("math")
        # MLX's CPU backend lets a launch run ahead of the host by only a few operations, so one launch
        # per step leaves the device idle while Python builds the graph; a launch per layer overlaps the
        # two. A GPU queues whole graphs, so there one launch per step is best.
        return AttentionPaths(
            in_place=self.built.get("attention"),
            prefill_attention=math.attention if math is not None else None,
            launch_per_layer=self.target.device == "cpu",
        )

    def compute_paths(self, dtype: str) -> ComputePaths:
        blas = blas_state()
        return ComputePaths(
            device=self.target.device,
            dtype=dtype,
            blas=blas.name,
            blas_detail=blas.reason,
            blas_config=blas.config,
            blas_core=blas.core,
            decode=self.names["decode"],
            attention=self.names["attention"],
            math=self.names["math"],
            prefill=self.names["prefill"],
            kv_write=_kv_write(self.names),
            not_taken=dict(self.not_taken),
            quantized_rows=getattr(self.built.get("decode"), "quantized_rows", "off"),
            weight_packing=getattr(self.built.get("decode"), "weight_packing", "off"),
            prefill_matmul=getattr(self.built.get("decode"), "prefill_matmul", "sgemm"),
            amx_matmul=getattr(self.built.get("decode"), "amx_matmul", "off"),
            niceness=os.nice(0) if hasattr(os, "nice") else 0,
        )


def choose(target: Target, config: EngineConfig) -> Choice:
    """Asks every fast path in order; see the module's table."""
    target = replace(
        target,
        quantized_rows=config.cuda_quantized_rows is not False,
        greedy_screen=config.cpu_greedy_screen is not False,
        huge_pages=config.cpu_huge_pages is not False,
        exact_packing=config.cpu_exact_packing is not False,
        onednn=config.cpu_onednn is not False,
        amx=config.cpu_amx is not False,
    )
    choice = Choice(target)
    for path in FAST_PATHS:
        reason = _refusal(path, choice, getattr(config, path.setting))
        if reason is None:
            built, reason = path.build(target, {r: n for r, n in choice.names.items() if r in choice.built})
            if reason is None:
                choice.names[path.role], choice.built[path.role] = path.name, built
                if getattr(built, "serves_chunks", False):  # it runs prefill chunks as rows too
                    choice.names["prefill"] = path.name
                continue
        choice.not_taken[path.name] = reason
    return choice


def _refusal(path: FastPath, choice: Choice, setting: bool | None) -> str | None:
    if setting is False:
        return f"engine.{path.setting} is false"
    if path.role in choice.built or choice.names[path.role] != PORTABLE[path.role]:
        return f"{choice.names[path.role]} serves {path.role}"
    if _GRAPH_ONLY & set(choice.names.values()) and path.name not in _GRAPH_ONLY:
        return "the decode graph serves this model"
    reason = path.applies(choice.target)
    if reason is None and setting is None and choice.target.device not in path.devices:
        return f"off by default on {choice.target.device} (engine.{path.setting}: true turns it on)"
    return reason


def _kv_write(names: dict[str, str]) -> str:
    """Where new K/V go into the pools: decode rows from the decode path, prefill chunks from the cache."""
    decode = {
        "c_forward": "the C forward",
        "cuda_graph": "the decode graph",
        "cuda_fused": "the fused attention kernel",
    }.get(names["decode"], "the paged cache")
    prefill = {
        "c_forward": "the C forward",
        "paired_prefill": "the paged cache, after each pair of chunks",
    }.get(names["prefill"], "the paged cache, as each layer runs")
    return f"decode rows: {decode}; prefill chunks: {prefill}"
