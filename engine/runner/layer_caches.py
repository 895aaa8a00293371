"""The model's per-layer cache kinds, read from its own `make_cache()`, and the cache objects one forward
hands the model in their place:

    the model's cache                       what a forward gets
    KVCache, RotatingKVCache(window w),     a paged cache over the KV pools (engine/runner/paged_attention.py),
      ChunkedKVCache                          masking to the last w tokens where the model's cache had a window
    ArraysCache (recurrent, SSM, conv       a state cache over the request's state slot
      state; MambaCache and friends)          (engine/runner/state_storage.py)
    CacheList(...)                          a CacheList of the above, in the same order
    anything else, or an ArraysCache        the model's own cache object, one per request and layer, kept
      whose arrays grow with the tokens       with its state slot; such a model decodes one row per forward

Owns this map and the load-time probes that size the storages and test batching; never decides which
blocks or slots a request gets (the scheduler does) and never runs a step (the model runner does).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.paged_attention import PagedLayerCache, StepLayout
from engine.runner.state_storage import StateRows, StateShape, StateStorage

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class KvLayer:
    index: int  # into the KV storage's pools
    window: int | None  # a RotatingKVCache's size: the layer attends to its last `window` tokens


@dataclass(frozen=True)
class StateLayer:
    index: int  # into the state storage's layers
    size: int  # the ArraysCache's number of arrays
    base: type = ArraysCache  # the model's ArraysCache class (mlx-lm's, or mlx-vlm's richer one)


@dataclass(frozen=True)
class NativeLayer:
    index: int  # into each slot's list of the model's own cache objects
    template: Any  # an empty cache of the model's: each request gets a deep copy


@dataclass(frozen=True)
class ListLayer:
    parts: tuple[Kind, ...]
    cls: type = CacheList  # the model's CacheList class (its layers may check for their own)


Kind = KvLayer | StateLayer | NativeLayer | ListLayer


class StateRowsMixin:
    """The model's ArraysCache over one forward's rows of a recurrent layer's state slots."""

    cache: list[Any]

    def __init__(self, storage: StateStorage, layer: int, rows: StateRows):
        super().__init__(len(storage.pools[layer]))  # type: ignore[call-arg]
        self.storage, self.layer, self.rows = storage, layer, rows
        self.cache = storage.read(layer, rows)

    def write_back(self) -> None:
        self.storage.write(self.layer, self.rows, self.cache)


class StateCache(StateRowsMixin, ArraysCache):
    """mlx-lm's ArraysCache over state slots."""


_STATE_CLASSES: dict[type, type] = {ArraysCache: StateCache}


def state_cache_class(base: type) -> type:
    """The state-slot cache built on the model's own ArraysCache class (mlx-vlm's adds update_window and
    friends, which its models call)."""
    if base not in _STATE_CLASSES:
        _STATE_CLASSES[base] = type(f"State{base.__name__}", (StateRowsMixin, base), {})
    return _STATE_CLASSES[base]


def is_arrays_cache(cache: Any) -> bool:
    return any(cls.__name__ == "ArraysCache" for cls in type(cache).__mro__)


def is_cache_list(cache: Any) -> bool:
    """mlx-lm's CacheList or mlx-vlm's (same shape: `.caches`)."""
    return any(cls.__name__ == "CacheList" for cls in type(cache).__mro__)


class NativeCaches:
    """The model's own cache objects of the layers the paged engine cannot model, per state slot. A
    request's first chunk (start 0) gets fresh copies; the model fills them in place as it runs."""

    def __init__(self, templates: list[Any]):
        self.templates = templates
        self._by_slot: dict[int, list[Any]] = {}

    def get(self, slot: int, index: int, fresh: bool) -> Any:
        caches = self._by_slot.setdefault(slot, [None] * len(self.templates))
        if fresh or caches[index] is None:
            caches[index] = copy.deepcopy(self.templates[index])
        return caches[index]


class LayerCaches:
    def __init__(self, model: nn.Module):
        make_cache = getattr(model, "make_cache", None)
        template = make_cache() if make_cache is not None else [KVCache() for _ in model.layers]
        self.model = model
        self.num_kv = 0
        self.num_state = 0
        self.native_templates: list[Any] = []
        growing = _growing_states(model, template)
        self.kinds = [self._kind(c, growing) for c in template]
        self.native = NativeCaches(self.native_templates) if self.native_templates else None
        self.batched_decode = True  # decode rows in one forward (else one forward per row)
        self.unbatched_reason: str | None = None  # why not, from the probe
        if self.native is not None:
            names = sorted({type(t).__name__ for t in self.native_templates})
            self.batched_decode = False
            self.unbatched_reason = f"the model's own caches ({', '.join(names)}) hold one request each"
        self.mask_ndim = 4  # of a batched mask: 5 where the model's scores are (B, kv_heads, repeats, L, S)

    def _kind(self, cache: Any, growing: set[int]) -> Kind:
        if is_cache_list(cache):
            return ListLayer(tuple(self._kind(c, growing) for c in cache.caches), type(cache))
        if is_arrays_cache(cache) and id(cache) not in growing:
            self.num_state += 1
            return StateLayer(self.num_state - 1, len(cache.cache), type(cache))
        if type(cache) in (KVCache, RotatingKVCache, ChunkedKVCache) and not getattr(cache, "keep", 0):
            self.num_kv += 1
            window = cache.max_size if isinstance(cache, RotatingKVCache) else None
            return KvLayer(self.num_kv - 1, window)
        # A RotatingKVCache with `keep` (sinks by position), a growing state or a cache of the model's
        # own: keep the model's object per request.
        self.native_templates.append(cache)
        return NativeLayer(len(self.native_templates) - 1, cache)

    @property
    def has_state(self) -> bool:
        """True where a request holds a state slot: recurrent layers, or caches of the model's own."""
        return self.num_state > 0 or self.native is not None

    @property
    def kinds_summary(self) -> str:
        """e.g. "kv x6, window 8 x2, state x4", for /v1/status."""
        counts: dict[str, int] = {}
        for kind in _leaves(self.kinds):
            if isinstance(kind, KvLayer):
                name = "kv" if kind.window is None else f"window {kind.window}"
            else:
                name = "state" if isinstance(kind, StateLayer) else type(kind.template).__name__
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{name} x{n}" for name, n in counts.items())

    def probe_shapes(self) -> tuple[list[LayerShape], list[list[StateShape | None]]]:
        """One lazy one-token forward tells each attention layer's KV heads and head dims, and each
        recurrent layer's state arrays."""
        kv = [_ShapeProbe() for _ in range(self.num_kv)]
        state = [s.base(s.size) for s in _leaves(self.kinds) if isinstance(s, StateLayer)]
        native = [copy.deepcopy(t) for t in self.native_templates]
        caches = [
            _build(k, lambda k: kv[k.index], lambda k: state[k.index], lambda k: native[k.index])
            for k in self.kinds
        ]
        self.model(mx.array([[0]]), cache=caches)
        if kv and all(p.shape is None for p in kv):
            raise UnsupportedModelError("no layer wrote K/V; the paged engine cannot serve this model")
        for p in kv:  # a cache the model makes but never writes (nemotron-nas: linear "attention")
            p.shape = p.shape or LayerShape(0, 0, 0)
        states = [
            [None if a is None else StateShape(tuple(a.shape[1:]), a.dtype) for a in c.cache] for c in state
        ]
        return [p.shape for p in kv], states  # type: ignore[misc]

    def build(
        self, storage: KVStorage, states: StateStorage | None, layout: StepLayout, rows: StateRows | None
    ) -> list[Any]:
        """The cache list for one forward; `write_back` after the model's call saves the new states."""

        def kv(kind: KvLayer) -> PagedLayerCache:
            return PagedLayerCache(storage, kind.index, layout, kind.window)

        def state(kind: StateLayer) -> Any:
            assert states is not None and rows is not None, "a recurrent layer needs its state rows"
            return state_cache_class(kind.base)(states, kind.index, rows)

        def native(kind: NativeLayer) -> Any:
            assert self.native is not None and rows is not None and len(rows.slots) == 1
            return self.native.get(rows.slots[0], kind.index, rows.all_fresh)

        return [_build(k, kv, state, native) for k in self.kinds]

    @staticmethod
    def write_back(caches: list[Any]) -> list[mx.array]:
        """Saves the forward's new states into their slots; returns the arrays of the model's own
        caches, for the runner to evaluate with the step (else their graphs would grow step by step)."""
        pending: list[mx.array] = []
        for cache in caches:
            for leaf in cache.caches if is_cache_list(cache) else (cache,):
                if isinstance(leaf, StateRowsMixin):
                    leaf.write_back()
                elif not isinstance(leaf, PagedLayerCache):
                    flat = tree_flatten(leaf.state)
                    pending += [a for _, a in flat if isinstance(a, mx.array)]  # type: ignore[str-unpack]
        return pending


def _leaves(kinds: list[Kind] | tuple[Kind, ...]) -> list[KvLayer | StateLayer | NativeLayer]:
    out: list[KvLayer | StateLayer | NativeLayer] = []
    for kind in kinds:
        out += _leaves(kind.parts) if isinstance(kind, ListLayer) else [kind]
    return out


def _build(kind: Kind, kv: Any, state: Any, native: Any) -> Any:
    if isinstance(kind, ListLayer):
        return kind.cls(*(_build(k, kv, state, native) for k in kind.parts))
    if isinstance(kind, KvLayer):
        return kv(kind)
    return state(kind) if isinstance(kind, StateLayer) else native(kind)


def _growing_states(model: nn.Module, template: list[Any]) -> set[int]:
    """ids of the template's ArraysCaches whose arrays change shape with the number of tokens (an n-gram
    history, say): two lazy forwards of 1 and 24 tokens on copies of the model's caches tell."""
    shapes = []
    for num_tokens in (1, 24):
        caches = copy.deepcopy(template)
        model(mx.zeros((1, num_tokens), dtype=mx.int32), cache=caches)
        shapes.append([[None if a is None else a.shape for a in c.cache] for c in _arrays_caches(caches)])
    return {id(t) for t, a, b in zip(_arrays_caches(template), shapes[0], shapes[1]) if a != b}


def _arrays_caches(caches: list[Any]) -> list[Any]:
    out: list[Any] = []
    for cache in caches:
        if is_cache_list(cache):
            out += _arrays_caches(list(cache.caches))
        elif is_arrays_cache(cache):
            out.append(cache)
    return out


class _ShapeProbe:
    """Records the K/V shapes a layer produces, without evaluating anything."""

    offset = 0
    start_position = 0

    def __init__(self) -> None:
        self.shape: LayerShape | None = None
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.shape = LayerShape(keys.shape[1], keys.shape[3], values.shape[3])
        self.keys, self.values = keys, values
        return keys, values

    def keys_and_values(self) -> tuple[mx.array | None, mx.array | None]:
        return self.keys, self.values

    def maybe_trim_front(self) -> None:
        pass
