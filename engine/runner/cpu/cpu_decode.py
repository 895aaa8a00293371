"""Batched decode steps of Llama-family models as one C call on MLX's CPU backend (engine/runner/cpu/cpu_decode.c).

Owns the kernel's build (the system C compiler, once per model shape and KV encoding, into the per-user
cache), the checks that it may serve a model, and the call; the load probe that compares it with MLX is
engine/runner/cpu/cpu_decode_probe.py's. Reads the weights and the paged pools where MLX keeps them (float32,
or int8/int4 codes with their scales and biases: engine/runner/kv_quant.py); writes only the decode rows'
new K/V slots, the same slots and encoding MLX's path would write. Never chooses blocks.

Why: a 16-row decode step of SmolLM2-135M is about 1,000 MLX operations. On the CPU backend each one
is dispatched to MLX's stream thread, and batched decode attention alone costs about a hundred BLAS
calls per layer; the matmuls are under half of the step. One C forward calls the same OpenBLAS for the
matmuls and does the rest in place: 98.9 against 154.6 ms per 16-row step (median, measured here).
A kernel called between MLX operations (attention only) was slower instead: every layer then waits for
the device, and the host's graph building no longer overlaps it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from engine.platform.blas import blas_state
from engine.platform.paths import cache_dir
from engine.runner.cpu.cpu_decode_probe import probe_refusal
from engine.runner.fast_path import Target, cache_refusal, quantized_kv_refusal
from engine.runner.kv_quant import group_size
from engine.runner.kv_storage import KVStorage

import mlx.core as mx
import numpy as np
from mlx import nn

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("cpu_decode.c")
_ENV_CC = "CC"
_KERNEL_BITS = (8, 4)  # the quantized pools the kernel reads and writes


class CpuDecode:
    """Calls the built kernel for one decode step: (rows,) tokens at (rows,) positions -> (rows, vocab)."""

    # Every row's K/V is written before any row attends, layer by layer: rows of one sequence at
    # consecutive positions (a row's drafts to verify, engine/spec_decode/) run as one call.
    rows_share_sequences = True

    def __init__(self, lib: ctypes.CDLL, sgemm: int, weights: list[mx.array], vocab: int, storage: KVStorage):
        self._storage = storage
        self._lib = lib
        self._fn = lib.decode_forward
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 3
        self._fn.argtypes += [ctypes.c_int, ctypes.c_void_p]
        self._sgemm = sgemm
        self._views = [_view(w) for w in weights]  # keeps the buffers' addresses valid while we live
        self._weights = (ctypes.c_void_p * len(self._views))(*(v.ctypes.data for v in self._views))
        self.vocab = vocab

    def __call__(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        tables: np.ndarray,
        pools: list[np.ndarray],
        pool_blocks: int,
    ) -> np.ndarray:
        """tokens, positions (rows,) int32; tables (rows, max_blocks) int32; `pools` as `pool_arrays`
        orders them, each a view of (kv_heads, pool_blocks, block_size, width). Runs synchronously."""
        rows, max_blocks = tables.shape
        logits = np.empty((rows, self.vocab), dtype=np.float32)
        pointers = (ctypes.c_void_p * len(pools))(*(p.ctypes.data for p in pools))
        status = self._fn(
            self._sgemm, self._weights, pointers, pool_blocks, rows,
            tokens.ctypes.data, positions.ctypes.data, tables.ctypes.data, max_blocks, logits.ctypes.data,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("the C decode forward could not allocate its scratch memory")
        return logits

    def step(self, tokens: mx.array, starts: list[int], tables: list[list[int]]) -> mx.array:
        """One decode step over the engine's pools (engine/runner/fast_path.py's DecodePath); waits for
        MLX's pending writes to them first. The tokens are known ones: async scheduling is off on the CPU."""
        storage = self._storage
        mx.eval(storage.arrays())
        width = max(len(t) for t in tables)
        table = np.array([t + [t[-1]] * (width - len(t)) for t in tables], dtype=np.int32)
        pools = [_view(a) for a in self.pool_arrays(storage)]
        logits = self(
            np.array(tokens.tolist(), dtype=np.int32), np.array(starts, dtype=np.int32), table, pools,
            storage.keys[0].shape[1],
        )  # fmt: skip
        return mx.array(logits)

    @staticmethod
    def pool_arrays(storage: KVStorage) -> list[mx.array]:
        """The pools in the kernel's order: per layer K then V, each its data and, quantized, its scales
        and biases (cpu_decode.c's `head_side`)."""
        keys, values = storage.side("keys"), storage.side("values")
        num_layers = len(storage.shapes)
        return [part[layer] for layer in range(num_layers) for side in (keys, values) for part in side]

    def quantize(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(n, head_dim) float32 -> the codes, scales and biases the kernel writes for them (a quantized
        build only): what the load probe and the tests compare with mx.quantize."""
        quant = self._storage.quant
        assert quant is not None, "a float32 build writes K/V as they are"
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        n, dim = vectors.shape
        codes_w, scales_w, _ = quant.widths(dim)
        codes = np.empty((n, codes_w), np.uint32)
        scales, biases = np.empty((n, scales_w), np.float32), np.empty((n, scales_w), np.float32)
        pointers = [ctypes.c_void_p(a.ctypes.data) for a in (vectors, codes, scales, biases)]
        self._lib.kv_quantize(pointers[0], ctypes.c_int(n), *pointers[1:])
        return codes, scales, biases


class CForwardDecode:
    """The plug-in (engine/runner/fast_path.py): decode rows of mlx-lm's float32 Llama as one C forward."""

    name = "c_forward"
    role = "decode"
    setting = "cpu_decode"
    devices: tuple[str, ...] = ("cpu",)

    def applies(self, target: Target) -> str | None:
        if target.device != "cpu":
            return "needs MLX's CPU backend"
        if blas_state().path is None:
            return "no BLAS library is loaded"
        quant = target.storage.quant
        # int8/int4 pools are read and written as MLX's gather path does; any other encoding is not.
        unknown = quant is not None and quant.bits not in _KERNEL_BITS
        quantized = quantized_kv_refusal(target.storage, "the C forward") if unknown else None
        # The kernel attends over every past token: a windowed layer (mistral's) would read too far back.
        return quantized or cache_refusal(target.model) or _llama_refusal(target.model, target.storage)

    def build(self, target: Target, picked: Mapping[str, str]) -> tuple[CpuDecode | None, str | None]:
        model, storage = target.model, target.storage
        sizes = _llama_sizes(model, storage)
        library = _build(sizes)
        if library is None:
            return None, "the kernel did not build (no C compiler, or see the log)"
        backbone = model.model
        head = model.lm_head.weight if "lm_head" in model else backbone.embed_tokens.weight
        weights = [backbone.embed_tokens.weight, backbone.norm.weight, head]
        for layer in backbone.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weights += [
                layer.input_layernorm.weight,
                attn.q_proj.weight,
                attn.k_proj.weight,
                attn.v_proj.weight,
            ]
            weights += [attn.o_proj.weight, layer.post_attention_layernorm.weight]
            weights += [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
        sgemm = ctypes.cast(ctypes.CDLL(str(blas_state().path)).cblas_sgemm, ctypes.c_void_p).value
        assert sgemm is not None, "the loaded BLAS exports cblas_sgemm"
        decode = CpuDecode(ctypes.CDLL(str(library)), sgemm, weights, int(sizes["VOCAB"]), storage)
        refusal = probe_refusal(decode, model, storage)
        return (None, refusal) if refusal else (decode, None)


def _llama_refusal(model: nn.Module, storage: KVStorage) -> str | None:
    """Why the kernel cannot serve `model`, or None where it is mlx-lm's Llama with plain float32 layers."""
    if type(model).__module__ != "mlx_lm.models.llama":
        return f"serves mlx-lm's llama models only, not {type(model).__module__}"
    if storage.dtype != mx.float32:
        return "serves float32 weights and KV only"
    backbone, args = model.model, model.args
    layers = backbone.layers
    if any(getattr(args, name, False) for name in ("attention_bias", "mlp_bias")):
        return "the model has attention or MLP biases"
    linears = [m for layer in layers for m in (*_projections(layer),)]
    if not all(type(m) is nn.Linear and "bias" not in m for m in linears):
        return "a projection is not a plain nn.Linear (quantized, or with a bias)"
    arrays = [m.weight for m in linears] + [backbone.embed_tokens.weight, backbone.norm.weight]
    if type(backbone.embed_tokens) is not nn.Embedding or any(a.dtype != mx.float32 for a in arrays):
        return "the embedding is not a plain float32 nn.Embedding"
    attn = layers[0].self_attn
    rope = attn.rope
    if type(rope) is not nn.RoPE or rope.traditional or rope.scale != 1.0 or rope.dims != attn.head_dim:
        return "the RoPE is scaled, traditional or partial"
    if attn.n_heads % attn.n_kv_heads or any(s != storage.shapes[0] for s in storage.shapes):
        return "layers differ in shape"
    return None


def _llama_sizes(model: nn.Module, storage: KVStorage) -> dict[str, int | str]:
    """The kernel's macros for a model `_llama_refusal` accepts."""
    backbone, args = model.model, model.args
    layers = backbone.layers
    attn = layers[0].self_attn
    rope = attn.rope
    sizes: dict[str, int | str] = {
        "H": args.hidden_size, "NQ": attn.n_heads, "KVH": attn.n_kv_heads, "HD": attn.head_dim,
        "FF": args.intermediate_size, "BS": storage.block_size, "NL": len(layers),
        "VOCAB": backbone.embed_tokens.weight.shape[0],
        "EPS": f"{float(layers[0].input_layernorm.eps)!r}f", "ROPE_BASE": f"{float(rope.base)!r}f",
    }  # fmt: skip
    if storage.quant is not None:
        sizes |= {"KV_BITS": storage.quant.bits, "KV_GROUP": group_size(attn.head_dim)}
    return sizes


def _projections(layer: nn.Module) -> tuple[nn.Module, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _build(sizes: dict[str, int | str]) -> Path | None:
    """The kernel built for `sizes` with this machine's compiler and CPU; built once, then cached."""
    compiler = os.environ.get(_ENV_CC) or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.info("no C compiler: decode steps run through MLX")
        return None
    source = _SOURCE.read_bytes()
    flags = ["-O3", "-march=native", "-ffast-math", "-shared", "-fPIC"]
    flags += [f"-D{name}={value}" for name, value in sizes.items()]
    key = hashlib.sha256(source + " ".join([compiler, *flags, _cpu_id()]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"cpu_decode-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:
        subprocess.run(
            [compiler, *flags, str(_SOURCE), "-o", str(tmp), "-lm"], check=True, capture_output=True
        )
        tmp.replace(target)  # atomic: a concurrent build of the same key writes the same bytes
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        logger.warning(
            "C decode kernel not built, decode runs through MLX: %s %s", exc, detail.decode()[-500:]
        )
        tmp.unlink(missing_ok=True)
        return None
    return target


def _cpu_id() -> str:
    """What -march=native depends on: a cache shared between machines must not mix their builds."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        flags = ""
    return f"{platform.machine()} {flags}"


def _view(array: mx.array) -> np.ndarray:
    """A zero-copy view of an evaluated, row-contiguous float32 (or uint32 codes) MLX array."""
    mx.eval(array)
    view = np.asarray(array)
    assert view.dtype in (np.float32, np.uint32) and view.flags["C_CONTIGUOUS"], (
        "the kernel reads plain arrays"
    )
    return view
