"""Batched decode steps of Llama-family models as one C call on MLX's CPU backend (engine/runner/cpu/cpu_decode.c).

Owns the kernel's build (the system C compiler, once per model shape and KV encoding, into the per-user
cache), the checks that it may serve a model, and the call; the load probe that compares it with MLX is
engine/runner/cpu/cpu_decode_probe.py's. Reads the weights where MLX keeps them (float32, or MLX's affine
4/8-bit codes with their scales and biases) and the paged pools (float32, or int8/int4 codes:
engine/runner/kv_quant.py); writes only its rows' new K/V slots, the same slots and encoding MLX's path
would write. Never chooses blocks. It takes prefill chunks too (`serves_chunks`).

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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.platform.blas import blas_state, default_blas_threads
from engine.runner.cpu import amx, exact_pack, huge_pages, native_build, onednn
from engine.runner.cpu.cpu_decode_probe import probe_refusal
from engine.runner.cpu.direct_rows import measure_direct_rows
from engine.runner.cpu.matrix import Matrix, shapes_of
from engine.runner.fast_path import Target, cache_refusal, quantized_kv_refusal
from engine.runner.kv_quant import group_size
from engine.runner.kv_storage import KVStorage

import mlx.core as mx
import numpy as np
from mlx import nn

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("cpu_decode.c")  # includes the cpu_*.h beside it
# The CPU the kernel is built for: this one by default; e.g. x86-64 (SSE2 only) builds the portable loops
# that a machine without AVX2 runs, which is how the tests check them on any machine.
_ENV_MARCH = "MLX_RAY_SERVE_KERNEL_MARCH"
_KERNEL_BITS = (8, 4)  # the quantized pools the kernel reads and writes
_WEIGHT_BITS = (8, 4)  # the quantized weights it reads (MLX's affine mode)
_WEIGHT_GROUPS = (32, 64, 128)
MAX_DIRECT = 32  # cpu_decode.c's MAX_DIRECT: the most rows one direct quantized matmul takes
SCREEN_ROWS = 3  # cpu_greedy.h's SCREEN_ROWS: the most greedy rows whose head one call screens
# measure_direct_rows' answers in this process by the build, the weights' shapes and formats and the
# threads: a second forward of one shape (a reload, the test suite's many engines) reuses them.
_DIRECT_ROWS: dict[tuple, tuple[int, int]] = {}


@dataclass(frozen=True)
class Blas:
    """The BLAS entry points the kernel calls, and the threads of its own loops."""

    sgemm: int
    sgemv: int | None
    threads: int


_FLOAT32_UNIT = 2.0**-24  # float32's unit roundoff
_SCREEN_CHUNK = 4096  # head rows per step of Screen.of


@dataclass(frozen=True)
class Screen:
    """A float32 head's bfloat16 copy (round to nearest even) and each row's bound on how far the
    screen's logit can lie from the full head's, per unit of the hidden row's norm (cpu_greedy.h)."""

    weights: np.ndarray  # (vocab, hidden) uint16, bfloat16 bits
    err: np.ndarray  # (vocab,) float32, rounded up

    @classmethod
    def of(cls, head: np.ndarray, huge: bool = False) -> Screen | None:
        """The screen of `head` (vocab, hidden) float32; None where a weight is not finite. `huge`: the
        copy on 2 MB pages (huge_pages.py), where it is read every greedy step."""
        vocab, hidden = head.shape
        gamma = hidden * _FLOAT32_UNIT / (1 - hidden * _FLOAT32_UNIT)  # any float32 sum of `hidden` terms
        weights = (
            huge_pages.aligned_empty((vocab, hidden), np.uint16)
            if huge
            else np.empty((vocab, hidden), np.uint16)
        )
        err = np.empty(vocab, np.float64)
        for first in range(0, vocab, _SCREEN_CHUNK):  # float64 copies of a few rows at a time
            rows = head[first : first + _SCREEN_CHUNK]
            if not np.isfinite(rows).all():
                return None
            bits = rows.view(np.uint32)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            copy = (rounded.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            exact = rows.astype(np.float64)
            norms = np.linalg.norm(exact, axis=1) + np.linalg.norm(copy, axis=1)
            err[first : first + len(rows)] = np.linalg.norm(exact - copy, axis=1) + gamma * norms
            weights[first : first + len(rows)] = rounded
        if huge:
            huge_pages.collapse(weights.ctypes.data, weights.nbytes)
        err = err * (1 + 1e-6) + 1e-30
        err32 = err.astype(np.float32)
        err32 = np.where(err32.astype(np.float64) < err, np.nextafter(err32, np.float32(np.inf)), err32)
        return cls(weights, err32)


class CpuDecode:
    """Calls the built kernel for one step: (rows,) tokens at (rows,) positions -> logits of the rows asked
    for. Weights in float32 or MLX's affine 4/8-bit codes (`Matrix`)."""

    # Every row's K/V is written before any row attends, layer by layer: rows of one sequence at
    # consecutive positions (a row's drafts to verify, a prefill chunk) run as one call.
    rows_share_sequences = True

    def __init__(
        self,
        lib: ctypes.CDLL,
        blas: Blas,
        weights: list[Matrix],
        vocab: int,
        storage: KVStorage,
        screen: bool = True,
        huge: bool = False,
    ):
        self._storage = storage
        self._lib = lib
        self._fn = lib.decode_forward
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 3
        self._fn.argtypes += [ctypes.c_int] * 2 + [ctypes.c_void_p] * 5
        self._use(weights)
        self.vocab = vocab
        # Prefill chunks run here too (engine/runner/model_runner.py), as rows of one sequence: over
        # quantized weights MLX's CPU quantized matmul is 20-40x slower than float32 from 16 rows up,
        # and over float32 ones the same sgemm calls without MLX's graph prefill 1.6x faster than MLX's
        # paired-chunk path (docs/benchmarks.md, "CPU speed against llama.cpp"). Not float32 weights over
        # int8/int4 pools: a chunk's rows here attend to the chunk's own K/V as stored (quantized), where
        # MLX's prefill attends to them unquantized, and the greedy output of those models is MLX's.
        self.serves_chunks = any(m.bits and not m.exact for m in weights) or storage.quant is None
        self.weight_packing = "off"
        self.blas = blas
        lib.configure.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 3
        lib.configure_onednn.argtypes = [ctypes.c_void_p] * 4
        # Many-row products through oneDNN (onednn.py), where attach_onednn kept it.
        self.onednn: onednn.OneDnn | None = None
        self.prefill_matmul = "sgemm"
        # Exact 4-bit weights' products on AMX (amx.py): prefill chunks (before oneDNN's) and decode steps
        # of up to 16 rows (before the own matmuls), where attach_amx kept each.
        amx.declare(lib)
        self.amx: amx.Amx | None = None
        self.amx_many = False  # rows past the own matmuls' (prefill chunks) go to AMX
        self.amx_few_min = amx.NEVER  # decode rows from which the few-row AMX kernel runs
        self.amx_matmul = "off"
        self._measure_direct_rows()
        # Greedy rows screen a float32 head through its bfloat16 copy (cpu_greedy.h); None: a quantized
        # or packed head (exact_pack.py), which the kernel reads whole, in fewer bytes than the copy.
        # The load probe may drop it (cpu_decode_probe.py).
        lib.screens.restype = ctypes.c_int
        self._screens = screen and lib.screens() == 1  # a vector build (cpu_greedy.h)
        self._huge = huge
        self.screen = self._screen_of(weights[2])

    def _screen_of(self, head: Matrix) -> Screen | None:
        return Screen.of(head.arrays[0], self._huge) if self._screens and not head.bits else None

    def _use(self, weights: list[Matrix]) -> None:
        """The weights the kernel reads; their buffers are kept while they are in use."""
        self._keep = [a for m in weights for a in (*m.arrays, m.source) if a is not None]
        self._weights = (ctypes.c_void_p * (4 * len(weights)))(*(p for m in weights for p in m.pointers))
        self._formats = np.array([m.format for m in weights], dtype=np.int32)
        self._matrices = weights

    def use_float32(self, weights: list[Matrix]) -> None:
        """Reads `weights` from now on (the float32 ones an exact packing stood for), with the direct
        rows measured anew for them, and a float32 head screened."""
        self._use(weights)
        self._measure_direct_rows()
        self.screen = self.screen or self._screen_of(weights[2])

    def _measure_direct_rows(self) -> None:
        """The row counts whose forwards are faster with the own matmuls, on this machine, for the
        weights in use."""
        key = (self.build, shapes_of(self._matrices), self.threads)
        if key not in _DIRECT_ROWS:  # a second forward of one shape in this process reuses the first's
            self.direct_min, self.direct_rows = 1, MAX_DIRECT
            _DIRECT_ROWS[key] = measure_direct_rows(self.scratch_forward, MAX_DIRECT)
        self.direct_min, self.direct_rows = _DIRECT_ROWS[key]
        if any(m.exact for m in self._matrices):
            # One row through the own matmuls too (not sgemv): the packed weights' expansion feeds the
            # float32 tile code, and same_logits compares the two at the settings served.
            self.direct_min = 1

    def same_logits(self, weights: list[Matrix], rows: tuple[int, ...]) -> bool:
        """Whether forwards over `weights` give the logits of forwards over this instance's, bit for bit,
        at each of `rows` (every row's logits, scratch pools, these direct-row settings): the second
        half of exact_pack.py's proof, covering the own matmuls and sgemm alike."""
        mine = self._matrices
        for n in rows:
            first = self.chunk_logits(n)
            self._use(weights)
            try:
                second = self.chunk_logits(n)
            finally:
                self._use(mine)
            if not np.array_equal(first.view(np.uint32), second.view(np.uint32)):
                return False
        return True

    def _scratch(self, rows: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list, int]:
        """A forward's inputs on scratch pools: one block per row, each row at position 0 of its own."""
        views = map(_view, self.pool_arrays(self._storage))
        pools = [np.zeros((v.shape[0], rows, *v.shape[2:]), v.dtype) for v in views]
        positions, tables = np.zeros(rows, dtype=np.int32), np.arange(rows, dtype=np.int32)[:, None]
        return tokens, positions, tables, pools, rows

    def _configure(self) -> None:
        """The library's settings are per process, and two models of one shape share one library: each
        call sets this instance's."""
        blas = self.blas
        self._lib.configure(blas.sgemm, blas.sgemv, blas.threads, self.direct_min, self.direct_rows)
        if self.onednn is None:
            self._lib.configure_onednn(None, None, None, None)
        else:
            self._lib.configure_onednn(*self.onednn.entry_points, self.onednn.handles)
        handles = None if self.amx is None else self.amx.handles
        self._lib.configure_amx(handles, int(self.amx_many), self.amx_few_min)

    @property
    def threads(self) -> int:
        """The threads of the forward's loops (and OpenBLAS's)."""
        return self.blas.threads

    @property
    def build(self) -> str:
        """The kernel's library file: its name is the build's key (source, flags, CPU)."""
        return Path(self._lib._name).name

    def attach_onednn(self) -> None:
        """Many-row products through oneDNN from now on, where onednn.choose keeps it."""
        self.onednn, self.prefill_matmul = onednn.choose(self)

    def attach_amx(self) -> None:
        """4-bit products on AMX from now on, the rows amx.choose gives it; where it takes prefill chunks,
        oneDNN's copies of its weights are freed (no product reads them any more)."""
        self.amx, self.amx_many, self.amx_few_min, self.amx_matmul = amx.choose(self)
        if self.amx is None or not self.amx_many or self.onednn is None:
            return
        taken = [i for i, handle in enumerate(self.amx.handles) if handle and self.onednn.handles[i]]
        for i in taken:
            self.onednn.drop(i)
        if taken:
            self.prefill_matmul += f"; {len(taken)} of its weights on AMX instead, their copies freed"

    @property
    def library(self) -> ctypes.CDLL:
        """The built kernel."""
        return self._lib

    @property
    def matrices(self) -> list[Matrix]:
        """The weights the kernel reads, in the forward's order."""
        return self._matrices

    def chunk_logits(self, rows: int) -> np.ndarray:
        """Every row's logits of a forward of `rows` rows on scratch pools (each row at position 0 of its
        own), tokens spread over the vocabulary."""
        inputs = self._scratch(rows, tokens=(np.arange(rows, dtype=np.int32) * 7919) % self.vocab)
        return self(*inputs, np.arange(rows, dtype=np.int32))

    def scratch_forward(self, rows: int) -> Callable[[int], float]:
        """A timer of whole forwards of `rows` rows on scratch pools (one block per row, each row at
        position 0 of its own: the matmuls are the work), for the load-time measurement and
        bench/cpu_forward.py: called with a direct_rows, it runs one forward with it and returns its
        seconds, then restores this instance's direct_rows."""
        inputs = self._scratch(rows, tokens=np.arange(rows, dtype=np.int32))
        last = np.array([rows - 1], dtype=np.int32)

        def forward(direct_rows: int) -> float:
            kept = self.direct_min, self.direct_rows
            self.direct_min, self.direct_rows = 1, direct_rows
            try:
                start = time.perf_counter()
                self(*inputs, last)
                return time.perf_counter() - start
            finally:
                self.direct_min, self.direct_rows = kept

        return forward

    def __call__(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        tables: np.ndarray,
        pools: list[np.ndarray],
        pool_blocks: int,
        logit_rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """tokens, positions (rows,) int32; tables (rows, max_blocks) int32; `pools` as `pool_arrays`
        orders them, each a view of (kv_heads, pool_blocks, block_size, width). Logits of `logit_rows`
        (int32 row indices; default: every row), in that order. Runs synchronously."""
        return self._forward(tokens, positions, tables, pools, pool_blocks, logit_rows, None)

    def greedy(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        tables: np.ndarray,
        pools: list[np.ndarray],
        pool_blocks: int,
        logit_rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """As `__call__`, but the greedy token of each of `logit_rows` (the first argmax of its logits,
        as numpy's), through the screened head (cpu_greedy.h). Also returns the logits array, which
        holds each row's candidates' logits (all of them for a row the screen could not narrow)."""
        assert self.screen is not None, "a float32 head screens"
        chosen = np.empty(len(logit_rows) if logit_rows is not None else len(tokens), dtype=np.int32)
        logits = self._forward(tokens, positions, tables, pools, pool_blocks, logit_rows, chosen)
        for row in np.flatnonzero(chosen < 0):  # the screen stepped aside: the row's full logits
            chosen[row] = int(np.argmax(logits[row]))
        return chosen, logits

    def _forward(self, tokens, positions, tables, pools, pool_blocks, logit_rows, chosen) -> np.ndarray:
        rows, max_blocks = tables.shape
        if logit_rows is None:
            logit_rows = np.arange(rows, dtype=np.int32)
        logits = np.empty((len(logit_rows), self.vocab), dtype=np.float32)
        pointers = (ctypes.c_void_p * len(pools))(*(p.ctypes.data for p in pools))
        screen = self.screen if chosen is not None else None
        self._configure()
        status = self._fn(
            self._weights, self._formats.ctypes.data, pointers, pool_blocks, rows,
            tokens.ctypes.data, positions.ctypes.data, tables.ctypes.data, max_blocks,
            len(logit_rows), logit_rows.ctypes.data, logits.ctypes.data,
            screen.weights.ctypes.data if screen else None, screen.err.ctypes.data if screen else None,
            chosen.ctypes.data if screen else None,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("the C decode forward could not allocate its scratch memory")
        return logits

    def step(
        self,
        tokens: mx.array,
        starts: list[int],
        tables: list[list[int]],
        logit_rows: list[int] | None = None,
    ) -> mx.array:
        """One step over the engine's pools (engine/runner/fast_path.py's DecodePath); waits for MLX's
        pending writes to them first. The tokens are known ones: async scheduling is off on the CPU."""
        return mx.array(self(*self._step_inputs(tokens, starts, tables, logit_rows)))

    def step_greedy(
        self, tokens: mx.array, starts: list[int], tables: list[list[int]], logit_rows: list[int]
    ) -> list[int] | None:
        """As `step`, for rows whose next token is the plain argmax of their logits: those tokens, or
        None where this head does not screen, or for more than SCREEN_ROWS rows (the caller takes
        `step` then)."""
        if self.screen is None or not 0 < len(logit_rows) <= SCREEN_ROWS:
            return None
        chosen, _ = self.greedy(*self._step_inputs(tokens, starts, tables, logit_rows))
        return chosen.tolist()

    def _step_inputs(self, tokens: mx.array, starts: list[int], tables: list[list[int]], logit_rows):
        """The kernel's inputs for a step over the engine's pools; waits for MLX's pending writes to them."""
        storage = self._storage
        mx.eval(storage.arrays())
        width = max(len(t) for t in tables)
        table = np.array([t + [t[-1]] * (width - len(t)) for t in tables], dtype=np.int32)
        pools = [_view(a) for a in self.pool_arrays(storage)]
        return (
            np.array(tokens.tolist(), dtype=np.int32), np.array(starts, dtype=np.int32), table, pools,
            storage.keys[0].shape[1], None if logit_rows is None else np.array(logit_rows, dtype=np.int32),
        )  # fmt: skip

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
        head = model.lm_head if "lm_head" in model else backbone.embed_tokens
        modules = [backbone.embed_tokens, backbone.norm, head]
        for layer in backbone.layers:
            attn, mlp = layer.self_attn, layer.mlp
            modules += [layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
            modules += [layer.post_attention_layernorm, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        huge = target.huge_pages and huge_pages.supported()
        if huge:
            _move_to_huge_pages(modules)
        lib, weights = ctypes.CDLL(str(library)), [_matrix(m) for m in modules]
        packing = exact_pack.pack(lib, weights, huge) if target.exact_packing else None
        decode = CpuDecode(
            lib,
            _blas(),
            packing.weights if packing and packing.packed else weights,
            int(sizes["VOCAB"]),
            storage,
            screen=target.greedy_screen,
            huge=huge,
        )
        if packing and packing.packed:
            _prove_packing(decode, packing, weights)
        elif packing:
            decode.weight_packing = "off (no layer weight is held exactly by bfloat16 or 4-bit groups)"
        else:
            decode.weight_packing = "off (engine.cpu_exact_packing is false)"
        if target.onednn:
            decode.attach_onednn()
        else:
            decode.prefill_matmul = "sgemm (engine.cpu_onednn is false)"
        if target.amx:
            decode.attach_amx()
        else:
            decode.amx_matmul = "off (engine.cpu_amx is false)"
        refusal = probe_refusal(decode, model, storage)
        return (None, refusal) if refusal else (decode, None)


_WEIGHT_PARTS = ("weight", "scales", "biases")  # what the kernel reads of a layer
# Row counts at which packed and float32 weights must give the same logits: the own matmuls' tile
# shapes (1-8 rows a tile, then more tiles) and sgemm's beyond direct_rows.
_PROOF_ROWS = (1, 2, 5, 8, 13, 16)


def _prove_packing(decode: CpuDecode, packing: exact_pack.Packing, weights: list[Matrix]) -> None:
    """Keeps the packed weights only where forwards over them give the float32 weights' logits bit
    for bit; else the float32 weights, with direct rows measured for them."""
    rows = (*_PROOF_ROWS, decode.direct_rows, decode.direct_rows + 1, 2 * MAX_DIRECT + 3)
    if decode.same_logits(weights, tuple(sorted(set(rows)))):
        decode.weight_packing = packing.describe(weights)
        logger.info("C forward: exact packing, %s", decode.weight_packing)
        return
    decode.weight_packing = "off (the packed weights' logits differed from the float32 ones' at load)"
    logger.warning("C forward: packed weights changed the logits; reading the float32 weights")
    decode.use_float32(weights)


def _move_to_huge_pages(modules: list[nn.Module]) -> None:
    """The modules' weights re-laid on 2 MB pages (engine/runner/cpu/huge_pages.py), same values."""
    unique = list({id(m): m for m in modules}.values())  # a tied head is the embedding
    slots = [(m, name) for m in unique for name in _WEIGHT_PARTS if name in m]
    moved, placed = huge_pages.relay([m[name] for m, name in slots])
    for (module, name), array in zip(slots, moved, strict=True):
        module[name] = array
    huge_pages.release_freed()  # the old copies' memory
    logger.info("C forward: %s", placed.describe())


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
    if "lm_head" in model:
        linears.append(model.lm_head)
    if not all(type(m) in (nn.Linear, nn.QuantizedLinear) and "bias" not in m for m in linears):
        return "a projection is not a plain or quantized nn.Linear without a bias"
    embedding = backbone.embed_tokens
    if type(embedding) not in (nn.Embedding, nn.QuantizedEmbedding):
        return "the embedding is not an nn.Embedding"
    if refusal := next(filter(None, map(_quantized_refusal, [*linears, embedding])), None):
        return refusal
    floats = [m.weight for m in [*linears, embedding] if not isinstance(m, _QUANTIZED)]
    if any(a.dtype != mx.float32 for a in [*floats, backbone.norm.weight]):
        return "a weight is not float32"
    attn = layers[0].self_attn
    rope = attn.rope
    if type(rope) is not nn.RoPE or rope.traditional or rope.scale != 1.0 or rope.dims != attn.head_dim:
        return "the RoPE is scaled, traditional or partial"
    if attn.n_heads % attn.n_kv_heads or any(s != storage.shapes[0] for s in storage.shapes):
        return "layers differ in shape"
    return None


_QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)


def _quantized_refusal(module: nn.Module) -> str | None:
    """Why the kernel cannot read a quantized layer's codes, or None (float layers too)."""
    if not isinstance(module, _QUANTIZED):
        return None
    mode = getattr(module, "mode", "affine")
    if mode != "affine" or module.bits not in _WEIGHT_BITS or module.group_size not in _WEIGHT_GROUPS:
        return (
            f"{mode} {module.bits}-bit weights in groups of {module.group_size}: the kernel reads "
            f"affine {'/'.join(map(str, _WEIGHT_BITS))}-bit groups of {'/'.join(map(str, _WEIGHT_GROUPS))}"
        )
    return None


def _matrix(module: nn.Module) -> Matrix:
    """A layer's weight as the kernel reads it; quantized scales and biases become float32 copies
    where the model keeps them in another dtype (they are 1/group of the weights)."""
    if not isinstance(module, _QUANTIZED):
        return Matrix((_view(module.weight),))
    parts = (module.weight, module.scales.astype(mx.float32), module.biases.astype(mx.float32))
    return Matrix(tuple(_view(a) for a in parts), module.bits, module.group_size)


def _blas() -> Blas:
    """The loaded BLAS's sgemm and sgemv. The kernel's own loops (its matmuls for few rows, attention)
    take as many threads as OpenBLAS has."""
    lib = ctypes.CDLL(str(blas_state().path))
    sgemm = ctypes.cast(lib.cblas_sgemm, ctypes.c_void_p).value
    assert sgemm is not None, "the loaded BLAS exports cblas_sgemm"
    sgemv = ctypes.cast(lib.cblas_sgemv, ctypes.c_void_p).value if hasattr(lib, "cblas_sgemv") else None
    threads = int(os.environ.get("OPENBLAS_NUM_THREADS") or default_blas_threads())
    return Blas(sgemm, sgemv, threads)


def _llama_sizes(model: nn.Module, storage: KVStorage) -> dict[str, int | str]:
    """The kernel's macros for a model `_llama_refusal` accepts."""
    backbone, args = model.model, model.args
    layers = backbone.layers
    attn = layers[0].self_attn
    rope = attn.rope
    sizes: dict[str, int | str] = {
        "H": args.hidden_size, "NQ": attn.n_heads, "KVH": attn.n_kv_heads, "HD": attn.head_dim,
        "FF": args.intermediate_size, "BS": storage.block_size, "NL": len(layers),
        "VOCAB": backbone.embed_tokens.weight.shape[0],  # codes or floats: one row per token either way
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
    compiler = native_build.compiler()
    if compiler is None:
        logger.info("no C compiler: decode steps run through MLX")
        return None
    flags = ["-O3", f"-march={os.environ.get(_ENV_MARCH) or 'native'}", "-ffast-math", "-shared", "-fPIC"]
    flags += [f"-D{name}={value}" for name, value in sizes.items()]
    flags.append("-pthread")
    key = build_key(compiler, flags)
    return native_build.compiled(
        "cpu_decode", key, [compiler, *flags, str(_SOURCE)], ["-lm"], "decode runs through MLX"
    )


def build_key(compiler: str, flags: list[str]) -> str:
    """What names a build in the cache: the source with every header it includes, the command and the CPU."""
    source = b"".join(p.read_bytes() for p in [_SOURCE, *sorted(_SOURCE.parent.glob("cpu_*.h"))])
    return hashlib.sha256(source + " ".join([compiler, *flags, _cpu_id()]).encode()).hexdigest()[:16]


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
