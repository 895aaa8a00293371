"""The per-request state of recurrent, SSM and convolution layers (mlx-lm's ArraysCache entries): one pool
per state array on the MLX device, shaped (num_slots + 1, *the array's shape for one sequence).

Owns the tensors and how one forward reads and writes them; which slot a request holds is the
scheduler's (engine/core/state_slots.py). Row `num_slots` is never written: a request's first chunk
reads it, so a new (or preempted and recomputed) request starts from zero state with no reset.

    pool[slot]          the state after the request's last computed token
    forward of rows b   reads pool[slot_b] (or the zero row where the row starts at token 0),
                        writes the state after its new tokens back to pool[slot_b]
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class StateShape:
    """One state array of one sequence, as the model's first forward left it."""

    shape: tuple[int, ...]  # without the batch axis
    dtype: mx.Dtype

    @property
    def nbytes(self) -> int:
        size = self.dtype.size
        for n in self.shape:
            size *= n
        return size


class StateStorage:
    def __init__(self, layers: list[list[StateShape | None]], num_slots: int):
        """`layers[i][j]`: state array j of recurrent layer i; None where the model leaves it unset."""
        self.layers = layers
        self.num_slots = num_slots
        self.zero_slot = num_slots
        self.pools: list[list[mx.array | None]] = [
            [None if s is None else mx.zeros((num_slots + 1, *s.shape), s.dtype) for s in layer]
            for layer in layers
        ]
        mx.eval([p for layer in self.pools for p in layer if p is not None])

    @staticmethod
    def bytes_per_slot(layers: list[list[StateShape | None]]) -> int:
        return sum(s.nbytes for layer in layers for s in layer if s is not None)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for layer in self.pools for p in layer if p is not None)

    def arrays(self) -> list[mx.array]:
        return [p for layer in self.pools for p in layer if p is not None]

    def read(self, layer: int, rows: StateRows) -> list[mx.array | None]:
        """Layer `layer`'s state for `rows`, (B, ...) per array; None for every array when all rows start
        fresh (the model then builds zeros of its own shape)."""
        if rows.all_fresh:
            return [None] * len(self.pools[layer])
        return [None if p is None else rows.take(p) for p in self.pools[layer]]

    def write(self, layer: int, rows: StateRows, arrays: list[mx.array | None]) -> None:
        """Saves the forward's states. An array the model left unset stays as it was, except for rows
        that started fresh: their slot may hold a finished request's state, which must not leak into a
        later chunk (ZAYA1-VL sets its second conv array only at decode)."""
        pools = self.pools[layer]
        for j, (pool, new) in enumerate(zip(pools, arrays)):
            if pool is not None and new is None and rows.all_fresh:
                new = mx.zeros((len(rows.slots), *pool.shape[1:]), dtype=pool.dtype)
            if pool is None or new is None:
                continue
            assert new.shape[1:] == pool.shape[1:], f"state {j} of layer {layer} changed shape"
            pools[j] = rows.put(pool, new.astype(pool.dtype))


class StateRows:
    """Which pool rows one forward's batch rows read and write."""

    def __init__(self, slots: list[int], fresh: list[bool], zero_slot: int):
        self.slots = slots
        self.all_fresh = all(fresh)
        reads = [zero_slot if f else s for s, f in zip(slots, fresh)]
        self._single = slots[0] if len(slots) == 1 else None
        self._read_single = reads[0] if len(slots) == 1 else None
        self._read = mx.array(reads, dtype=mx.int32)
        self._write = mx.array(slots, dtype=mx.int32)

    def take(self, pool: mx.array) -> mx.array:
        if self._read_single is not None:
            return pool[self._read_single : self._read_single + 1]
        return mx.take(pool, self._read, axis=0)

    def put(self, pool: mx.array, new: mx.array) -> mx.array:
        if self._single is not None:
            pool[self._single : self._single + 1] = new
        else:
            pool[self._write] = new
        return pool
