"""Decode rows of a Llama-shaped model as a few fused kernels per layer, compiled at bucketed shapes, for
MLX's CUDA backend (engine/runner/cuda/layer_kernels.py has the kernels and what they replace).

Owns the fused forward, the check that a model has the shape it computes and the load-time probe that
it gives the model's own logits; never chooses blocks. Per layer the step launches eight kernels where
the model's own call through the decode graph launches about eighteen:

    h, x = add_rms_norm(h, d, input norm)        (the first layer: the norm alone)
    qkv  = x @ [Wq; Wk; Wv].T                    one product (engine/runner/cuda/fused_projections.py)
    a    = rope_write_attend(qkv, cos/sin, pools) RoPE, the paged K/V write and attention in one kernel
    d    = o_proj(a)
    h, x = add_rms_norm(h, d, post-attention norm)
    d    = mlp(x)                                gate and up as one product, SwiGLU, down

RoPE's cos and sin for each row's position come from the model's own rope module applied once per step
to a basis (ones where a rotated pair starts), so every rope variant mlx-lm builds (Llama 3 scaling,
YaRN, plain) is reproduced as it computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.runner import attention_hook
from engine.runner.cuda import cuda_attention
from engine.runner.cuda.decode_graph import DecodeGraph, bucketed_step
from engine.runner.cuda.fused_projections import FusedLinears, fuse_gate_up, fuse_qkv, fused_products
from engine.runner.cuda.layer_kernels import CudaKernels, ReferenceKernels
from engine.runner.cuda.quantized_rows import QuantizedRowsUse
from engine.runner.fast_path import Head, Target, cache_refusal, quantized_kv_refusal
from engine.runner.kv_storage import KVStorage

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten

_PROJECTIONS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}
_PROBE_STEPS = 6
_PROBE_ROWS = 3
_PROBE_TOLERANCE = {mx.float32: 1e-3}  # relative to the largest logit; half types get _HALF_TOLERANCE
_HALF_TOLERANCE = 1e-2
# Over tens of layers a half type's rounding alone moves the logits by more than _HALF_TOLERANCE (SmolLM2-
# 135M, 30 layers, bf16 on an H200: the own call is 0.026 of the largest logit from float32, and the fused
# forward 0.019 from the own call). Past the tolerance, the fused forward is kept where it is no further
# from the model's own call in float32 than this many times the own call in the half type is.
_HALF_RATIO = 2.0
# The float32 copy that judgement holds while it runs, at most: a larger half-type model that misses the
# tolerance keeps the decode graph, as before.
_FLOAT32_PROBE_MAX_BYTES = 8 << 30


class CudaFusedDecode:
    """The plug-in (engine/runner/fast_path.py): fused per-layer kernels for Llama-shaped models."""

    name = "cuda_fused"
    role = "decode"
    setting = "cuda_fused"
    devices: tuple[str, ...] = ("gpu",)

    def applies(self, target: Target) -> str | None:
        if target.device != "gpu" or not cuda_attention.kernel_available():
            return "needs MLX's CUDA backend"
        return shape_refusal(target)

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[FusedDecode | None, str | None]:
        fused = FusedDecode.for_target(target, CudaKernels(), QuantizedRowsUse(target.quantized_rows))
        if isinstance(fused, str):
            return None, fused
        refusal = attention_hook.pool_refusal(target.model)
        if refusal is not None:
            return None, refusal
        reason = probe(fused, target, reference_kernel=True)
        return (fused, None) if reason is None else (None, reason)


def shape_refusal(target: Target) -> str | None:
    """Why the fused forward cannot compute `target`'s model, or None."""
    model = target.model
    if getattr(model, "mrope", False):
        return "M-RoPE rows need explicit positions"
    reason = quantized_kv_refusal(target.storage, "the fused attention kernel")
    if reason is not None:
        return reason
    if target.head is None:
        return "the model's head is not split from its backbone"
    backbone = getattr(model, "model", None)
    if type(getattr(backbone, "norm", None)) is not nn.RMSNorm or not hasattr(backbone, "embed_tokens"):
        return "not a Llama-shaped backbone (embed_tokens, layers, an RMSNorm)"
    for layer in getattr(backbone, "layers", []):
        reason = _layer_refusal(layer)
        if reason is not None:
            return reason
    dims = {(s.k_head_dim, s.v_head_dim) for s in target.storage.shapes}
    if any(k != v or not cuda_attention.supports(k, target.storage.dtype) for k, v in dims):
        return "the kernel needs equal K and V head dims, a multiple of 32 up to 256"
    return cache_refusal(model)


def _layer_refusal(layer: Any) -> str | None:
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    if any(type(n) is not nn.RMSNorm for n in norms):
        return "a layer without the two RMSNorms of a Llama block"
    for parent, names in _PROJECTIONS.items():
        if any(not isinstance(getattr(getattr(layer, parent, None), n, None), nn.Module) for n in names):
            return f"a layer whose {parent} lacks {', '.join(names)}"
    attn = layer.self_attn
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "per-head q/k norms"
    rope = getattr(attn, "rope", None)
    if not all(hasattr(attn, a) for a in ("n_heads", "n_kv_heads", "scale")) or not hasattr(
        rope, "traditional"
    ):
        return "an attention without n_heads, n_kv_heads, scale and a rope module"
    dims = getattr(rope, "dims", None)
    if dims is None or dims != getattr(attn, "head_dim", None):
        return "RoPE over part of the head, or a head dim the attention does not name"
    return None


@dataclass
class _Attention:
    n_heads: int
    scale: float
    traditional: bool


@dataclass
class _Layer:
    qkv: FusedLinears
    attn: _Attention
    o_proj: nn.Module
    mlp: nn.Module
    input_norm: nn.RMSNorm
    post_norm: nn.RMSNorm


class _Step:
    def __init__(self, offsets: mx.array, table: mx.array, slots: mx.array):
        self.table, self.slots, self.lengths = table, slots, offsets + 1


class FusedDecode:
    """Runs B single-token rows through the fused forward, padded to bucket shapes (decode_graph.py's map)."""

    rows_share_sequences = False  # each row writes its K/V while others attend: no two rows of one sequence

    def __init__(self, model: nn.Module, storage: KVStorage, head: Head, layers: list[_Layer], kernels: Any):
        self.backbone = model.model
        self.storage, self.head, self.layers, self.kernels = storage, head, layers, kernels
        self.quantized_rows = "off"  # what the 4-bit rows kernel serves (quantized_rows.py), for /v1/status
        self.num_layers = len(layers)
        self.rope = model.layers[0].self_attn.rope
        self.basis = _rope_basis(storage.shapes[0].k_head_dim, self.rope.traditional)
        self._compiled = mx.compile(self._forward)

    @classmethod
    def for_target(
        cls, target: Target, kernels: Any, wrap: QuantizedRowsUse | None = None
    ) -> FusedDecode | str:
        """Fuses the model's projections and builds the forward; a reason where a layer does not fuse."""
        model = target.model
        qkvs = fuse_qkv(model, wrap)
        fuse_gate_up(model, wrap)
        if len(qkvs) != len(model.layers):
            return "the q, k and v projections differ in kind and cannot be one product"
        head = target.head
        if wrap is not None:  # the 4-bit kernel for o_proj, down_proj and the head too
            wrap.rewrite(model)
            head = wrap.take(head) if isinstance(head, nn.Module) else head
        layers = [
            _Layer(
                qkv,
                _Attention(layer.self_attn.n_heads, layer.self_attn.scale, layer.self_attn.rope.traditional),
                layer.self_attn.o_proj,
                layer.mlp,
                layer.input_layernorm,
                layer.post_attention_layernorm,
            )
            for qkv, layer in zip(qkvs, model.layers)
        ]
        assert head is not None, "shape_refusal checked the head"
        fused = cls(model, target.storage, head, layers, kernels)
        if wrap is not None:
            fused.quantized_rows = wrap.summary
        return fused

    def step(self, tokens: mx.array, offsets: list[int], tables: list[list[int]]) -> mx.array:
        """tokens (B,) int32 (may be lazy); returns lazy logits (B, vocab). The CUDA kernels write the
        pools in place and hand them back; the reference kernels scatter, like the decode graph."""
        return bucketed_step(self._compiled, self.storage, tokens, offsets, tables)

    def _forward(self, tokens, offsets, table, slots, *pools):
        step = _Step(offsets, table, slots)
        rows, dim, n = tokens.shape[0], self.basis.shape[-1], self.num_layers
        # A materialized basis: MLX's CUDA RoPE gives a broadcast input's strides to its output, so the
        # rows of a broadcast basis would all land in one row.
        basis = mx.zeros((rows, 1, 1, dim), mx.float32) + self.basis
        cos_sin = self.rope(basis, offset=offsets).reshape(rows, dim)
        h = self.backbone.embed_tokens(tokens)
        x = self.layers[0].input_norm(h)
        new_pools: list[list[mx.array]] = [[], []]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv.linear(x)
            out, written = self.kernels.rope_write_attend(
                qkv, cos_sin, (pools[i], pools[n + i]), step, layer.attn
            )
            new_pools[0].append(written[0])
            new_pools[1].append(written[1])
            h, x = self.kernels.add_rms_norm(
                h, layer.o_proj(out), layer.post_norm.weight, layer.post_norm.eps
            )
            norm = self.layers[i + 1].input_norm if i + 1 < n else self.backbone.norm
            h, x = self.kernels.add_rms_norm(h, layer.mlp(x), norm.weight, norm.eps)
        return [self.head(x), *new_pools[0], *new_pools[1]]


def _rope_basis(dim: int, traditional: bool) -> mx.array:
    """Ones where a rotated pair starts: RoPE turns them into cos there and sin at the pair's partner."""
    ones = mx.arange(dim) % 2 == 0 if traditional else mx.arange(dim) < dim // 2
    return ones.astype(mx.float32).reshape(1, 1, 1, dim)


def reference(target: Target) -> FusedDecode | str:
    """The fused forward in MLX operations (layer_kernels.ReferenceKernels): the kernels' contract, on
    any device."""
    return FusedDecode.for_target(target, ReferenceKernels())


def probe(fused: FusedDecode, target: Target, reference_kernel: bool = False) -> str | None:
    """Runs a few staggered decode steps through the fused forward and through the model's own call in
    the decode graph on the same blocks; None where the logits agree. With `reference_kernel` the model's
    attention runs in the paged attention kernel (engine/runner/cuda/cuda_attention.py), whose float32
    accumulation the fused kernel shares: in bf16 a different attention's rounding alone moves a random
    model's logits by a few percent, which would hide a real error behind a loose tolerance. A half-type
    model past the tolerance is judged against its own call in float32 (_HALF_RATIO)."""
    storage = target.storage
    per_row = -(-_PROBE_STEPS // storage.block_size)
    if _PROBE_ROWS * per_row > storage.num_blocks:
        return "the KV pool is too small for the load-time probe"
    own = DecodeGraph(target.model, storage, use_kernel=reference_kernel)
    expected, got = (
        _probe_run(own, storage.block_size, per_row),
        _probe_run(fused, storage.block_size, per_row),
    )
    worst = _worst(expected, got)
    if worst <= _PROBE_TOLERANCE.get(storage.dtype, _HALF_TOLERANCE):
        return None
    reason = f"its logits differ from the model's own call by {worst:.3g} of the largest logit on a probe"
    if storage.dtype == mx.float32:
        return reason
    if _floating_bytes(target.model) * 4 // storage.dtype.size > _FLOAT32_PROBE_MAX_BYTES:
        return f"{reason}; too large to hold in float32 for a closer look"
    exact = _float32_run(target, reference_kernel, per_row)
    own_error, fused_error = _worst(exact, expected), _worst(exact, got)
    if fused_error <= _HALF_RATIO * own_error:
        return None
    return (
        f"{reason}, and from its float32 call by {fused_error:.3g} where the own call is {own_error:.3g} off"
    )


def _worst(expected: list[mx.array], got: list[mx.array]) -> float:
    """The largest difference of any step, relative to that step's largest expected logit."""
    return max(  # type: ignore[type-var, return-value]  # .item() of a float32 scalar
        (mx.abs(a - b).max() / mx.maximum(mx.abs(a).max(), 1e-6)).item() for a, b in zip(expected, got)
    )


def _float_modules(model: nn.Module) -> list[nn.Module]:
    """The model and the fused products that sit outside its tree: everything holding its weights."""
    return [model, *(p for p in fused_products(model) if isinstance(p, nn.Module))]


def _floating_bytes(model: nn.Module) -> int:
    """The bytes of the model's floating weights, the fused products' included."""
    modules = _float_modules(model)
    total = 0
    for module in modules:
        for item in tree_flatten(module.parameters()):
            array = item[1]
            if isinstance(array, mx.array) and mx.issubdtype(array.dtype, mx.floating):
                total += array.nbytes
    return total


def _float32_run(target: Target, reference_kernel: bool, per_row: int) -> list[mx.array]:
    """The probe's steps through the model's own call with its floating weights in float32 (the fused
    products' too), on float32 pools of its own; the weights it had are put back. Holds a float32 copy
    of the floating weights meanwhile."""
    model, storage = target.model, target.storage
    modules = _float_modules(model)
    saved = [m.parameters() for m in modules]
    try:
        for m in modules:
            m.set_dtype(mx.float32)
        pools = KVStorage(storage.shapes, _PROBE_ROWS * per_row, storage.block_size, mx.float32)
        own = DecodeGraph(model, pools, use_kernel=reference_kernel)
        return _probe_run(own, storage.block_size, per_row)
    finally:
        for m, params in zip(modules, saved):
            m.update(params)


def _probe_run(path: Any, block_size: int, per_row: int) -> list[mx.array]:
    """Row r joins at step r, so rows have different lengths; tokens are fixed."""
    out = []
    for s in range(_PROBE_STEPS):
        active = [r for r in range(_PROBE_ROWS) if r <= s]
        offsets = [s - r for r in active]
        tables = [
            list(range(r * per_row, r * per_row + o // block_size + 1)) for r, o in zip(active, offsets)
        ]
        tokens = mx.array([(7 * r + 13 * s + 1) % 100 for r in active], dtype=mx.int32)
        logits = path.step(tokens, offsets, tables).astype(mx.float32)
        mx.eval(logits, *path.storage.arrays())
        out.append(logits)
    return out
