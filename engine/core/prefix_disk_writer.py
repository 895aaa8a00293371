"""The disk tier's writer thread: takes blocks' NumPy arrays from the engine and saves them through
engine/core/prefix_disk.py's store, off the step. Owns its queue and thread; never touches MLX.

The queue is bounded in bytes; a block that does not fit is dropped and counted, so the step never
waits on the disk. Saves are atomic (the store's temp file and rename): dying mid-write loses only the
blocks not yet renamed into place.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref

from engine.core.prefix_disk import PrefixDiskStore

import numpy as np

logger = logging.getLogger(__name__)

_Job = tuple[bytes, list[np.ndarray], int] | None  # (hash, arrays, bytes); None stops the thread


class PrefixDiskWriter:
    def __init__(self, store: PrefixDiskStore, max_pending_bytes: int):
        self.store = store
        self.max_pending_bytes = max_pending_bytes
        self.num_written = 0  # blocks saved
        self.num_dropped = 0  # blocks not saved: the queue was full
        self.num_failed = 0  # blocks whose save raised (disk full, permissions): logged
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._lock = threading.Lock()
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self._thread = threading.Thread(target=self._run, name="prefix-disk-writer", daemon=True)
        self._thread.start()
        # A normal interpreter exit flushes what is queued; the daemon thread alone would be cut off.
        atexit.register(_close_at_exit, weakref.ref(self))

    def wants(self, block_hash: bytes) -> bool:
        """False for a block already on disk or queued: it is not copied out again."""
        return block_hash not in self._pending and not self.store.contains(block_hash)

    def submit(self, block_hash: bytes, arrays: list[np.ndarray]) -> bool:
        """Queues the block for saving; False (and counted) when the queue is full or closed."""
        num_bytes = sum(a.nbytes for a in arrays)
        with self._lock:
            if not self._thread.is_alive() or self._pending_bytes + num_bytes > self.max_pending_bytes:
                self.num_dropped += 1
                return False
            self._pending.add(block_hash)
            self._pending_bytes += num_bytes
        self._queue.put((block_hash, arrays, num_bytes))
        return True

    def flush(self) -> None:
        """Returns once every queued block is saved (or failed)."""
        self._queue.join()

    def close(self) -> None:
        """Flushes, then stops the thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            block_hash, arrays, num_bytes = job
            try:
                if self.store.save(block_hash, arrays):
                    self.num_written += 1
            except Exception:  # one block's failure must not stop the writer
                self.num_failed += 1
                logger.exception("prefix disk tier: saving block %s failed", block_hash.hex())
            finally:
                with self._lock:
                    self._pending.discard(block_hash)
                    self._pending_bytes -= num_bytes
                self._queue.task_done()
        self._queue.task_done()


def _close_at_exit(ref: weakref.ref[PrefixDiskWriter]) -> None:
    writer = ref()
    if writer is not None:
        writer.close()
