"""Moves prefix-cache blocks between the MLX KV storage and the disk tier, for the engine's step.

Owns the disk store and its writer thread (engine/core/prefix_disk*.py) and the copies between MLX and
NumPy; which blocks move is the KV cache manager's (its `to_offload` and `to_load` queues). The engine
calls `save_new_blocks` before `schedule()` (a newly cached block's id may be reused by the next
allocation) and `load_hits` after it (disk hits' KV must be in place before the model reads it).
"""

from __future__ import annotations

from pathlib import Path

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.prefix_disk import PrefixDiskStore
from engine.core.prefix_disk_writer import PrefixDiskWriter
from engine.runner.kv_storage import KVStorage

import mlx.core as mx
import numpy as np

_GB = 1 << 30


class PrefixOffload:
    def __init__(self, kv: KVCacheManager, storage: KVStorage, writer: PrefixDiskWriter | None):
        self.kv = kv
        self.storage = storage
        self.writer = writer  # None: no disk tier, every call is a no-op

    @classmethod
    def build(cls, config: EngineConfig, kv: KVCacheManager, storage: KVStorage) -> PrefixOffload:
        """The disk tier where `prefix_cache_disk` is set and this model's prefix cache is on."""
        disk = config.prefix_cache_disk
        if disk is None or not kv.enable_prefix_caching:
            return cls(kv, storage, None)
        # Blocks are interchangeable only between engines that would compute the same KV into the
        # same layout: the same model source, storage format and block size.
        identity = f"model {config.model} | {storage.identity} | block_size {config.block_size}"
        probe = [_to_numpy(mx.take(a, mx.array([0]), axis=1))[:, 0] for a in storage.arrays()]
        layout = [(a.dtype, a.shape) for a in probe]
        store = PrefixDiskStore(Path(disk.path).expanduser(), identity, int(disk.max_gb * _GB), layout)
        kv.attach_disk(store)
        return cls(kv, storage, PrefixDiskWriter(store, disk.max_pending_bytes))

    def save_new_blocks(self) -> None:
        """Copies the blocks cached since the last call, less those on disk or queued, to the writer."""
        pairs, self.kv.to_offload = self.kv.to_offload, []
        if self.writer is None or not pairs:
            return
        wanted: dict[bytes, int] = {}
        for block_id, block_hash in pairs:
            if block_hash not in wanted and self.writer.wants(block_hash):
                wanted[block_hash] = block_id
        if not wanted:
            return
        ids = mx.array(list(wanted.values()))
        host = [_to_numpy(mx.take(a, ids, axis=1)) for a in self.storage.arrays()]
        for j, block_hash in enumerate(wanted):
            self.writer.submit(block_hash, [a[:, j] for a in host])

    def load_hits(self) -> None:
        """Writes the disk hits that `allocate` gave blocks into the KV storage."""
        loads, self.kv.to_load = self.kv.to_load, []
        if not loads:
            return
        ids = mx.array([block_id for block_id, _ in loads])
        for i, pool in enumerate(self.storage.arrays()):
            data = mx.array(np.stack([arrays[i] for _, arrays in loads], axis=1))
            pool[:, ids] = data if data.dtype == pool.dtype else data.view(pool.dtype)

    def flush(self) -> None:
        """Saves the blocks cached so far and returns once they are on disk; the writer goes on."""
        if self.writer is not None:
            self.save_new_blocks()
            self.writer.flush()

    def close(self) -> None:
        """Saves the blocks cached since the last step (an engine that went idle has not copied its
        last step's out yet) and every queued block, then stops the writer thread."""
        if self.writer is not None:
            self.save_new_blocks()
            self.writer.close()

    @property
    def num_written(self) -> int:
        return self.writer.num_written if self.writer is not None else 0

    @property
    def num_dropped(self) -> int:
        return self.writer.num_dropped if self.writer is not None else 0


def _to_numpy(array: mx.array) -> np.ndarray:
    # NumPy has no bfloat16: such blocks travel as their raw 16 bits, viewed back on load.
    return np.array(array.view(mx.uint16) if array.dtype == mx.bfloat16 else array)
