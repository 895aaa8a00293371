"""The prefix cache's disk tier: one file per full KV block, named by the block's chain hash, in a
directory named by the model identity. Owns the files and their LRU index; holds NumPy arrays and
bytes only, never MLX tensors, and never decides which blocks to keep (the KV cache manager does).

    <path>/<sha256(identity)[:24]>/<chain hash hex>.kvb
        MAGIC (8 bytes) | header length (u32 LE) | header JSON | payload
        header: identity, hash, blake2b(payload), each array's dtype and shape
        payload: the arrays' C-order bytes, in order

A file is written to a temp name and renamed into place (os.replace is atomic on POSIX), so a process
that dies mid-write leaves at most a temp file, which is never indexed. A file whose header, identity,
hash or checksum does not hold is logged, removed and never served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

MAGIC = b"MRSKVB1\n"
SUFFIX = ".kvb"
TEMP_SUFFIX = ".tmp"
# A temp file older than this is a dead writer's: removed at startup. Younger ones may be another
# replica's write in flight on the same directory, so they are left alone.
STALE_TEMP_S = 600.0
_LEN = struct.Struct("<I")
Layout = list[tuple[np.dtype, tuple[int, ...]]]  # each array's dtype and shape in one block


class BadBlockFile(Exception):
    """A block file that must not be served: why is the message."""


def identity_dir(root: Path, identity: str) -> Path:
    return root / hashlib.sha256(identity.encode()).hexdigest()[:24]


class PrefixDiskStore:
    """Block files under one identity, bounded by `max_bytes` with least-recently-used eviction.

    Thread-safe: the engine thread looks up and loads, a writer thread saves (engine/core/prefix_disk_writer.py).
    """

    def __init__(self, root: Path, identity: str, max_bytes: int, layout: Layout | None = None):
        """`layout`: each array's dtype and shape in a block; a file whose arrays differ is bad."""
        self.identity = identity
        self.layout = layout
        self.max_bytes = max_bytes
        self.dir = identity_dir(root, identity)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "IDENTITY").write_text(identity + "\n")  # for people: which model these blocks are
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # hash -> file bytes, oldest first
        self.num_bytes = 0
        self.num_evictions = 0
        self.num_bad_files = 0
        self._scan()

    def _scan(self) -> None:
        """Indexes the directory's block files by mtime (oldest first); trims it to the bound."""
        found = []
        for entry in os.scandir(self.dir):
            name = entry.name
            try:
                stat = entry.stat()
            except FileNotFoundError:  # another replica evicted it meanwhile
                continue
            if name.endswith(TEMP_SUFFIX):
                if time.time() - stat.st_mtime > STALE_TEMP_S:
                    _unlink(Path(entry.path))
                continue
            block_hash = _hash_of(name)
            if block_hash is not None:
                found.append((stat.st_mtime, block_hash, stat.st_size))
        for _, block_hash, size in sorted(found):
            self._index[block_hash] = size
            self.num_bytes += size
        with self._lock:
            self._evict_to(self.max_bytes)
        logger.info("prefix disk tier %s: %d blocks, %d bytes", self.dir, len(self._index), self.num_bytes)

    @property
    def num_blocks(self) -> int:
        return len(self._index)

    def contains(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def path_of(self, block_hash: bytes) -> Path:
        return self.dir / (block_hash.hex() + SUFFIX)

    def load(self, block_hash: bytes) -> list[np.ndarray] | None:
        """The block's arrays, verified; None when it is not on disk or its file fails a check (then
        the file is logged and removed)."""
        if block_hash not in self._index:
            return None
        path = self.path_of(block_hash)
        try:
            arrays = decode(path.read_bytes(), self.identity, block_hash, self.layout)
        except FileNotFoundError:  # another replica sharing the directory evicted it
            self._forget(block_hash)
            return None
        except BadBlockFile as exc:
            logger.warning("prefix disk tier: skipping %s: %s; removing it", path, exc)
            self.num_bad_files += 1
            self._forget(block_hash)
            _unlink(path)
            return None
        self._touch(block_hash, path)
        return arrays

    def save(self, block_hash: bytes, arrays: list[np.ndarray]) -> bool:
        """Writes the block unless it is on disk already; False when it was."""
        if block_hash in self._index:
            return False
        data = encode(arrays, self.identity, block_hash)
        path = self.path_of(block_hash)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            with open(temp, "wb") as f:
                f.write(data)
            os.replace(temp, path)  # readers see the whole file or none of it
        finally:
            _unlink(temp)
        with self._lock:
            if block_hash not in self._index:
                self._index[block_hash] = len(data)
                self.num_bytes += len(data)
            self._evict_to(self.max_bytes)
        return True

    def _touch(self, block_hash: bytes, path: Path) -> None:
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)
        try:
            os.utime(path)  # the next startup's scan orders by mtime
        except FileNotFoundError:
            pass

    def _forget(self, block_hash: bytes) -> None:
        with self._lock:
            size = self._index.pop(block_hash, None)
            if size is not None:
                self.num_bytes -= size

    def _evict_to(self, max_bytes: int) -> None:
        """Removes least recently used files until the rest fit `max_bytes`. Caller holds the lock."""
        while self.num_bytes > max_bytes and self._index:
            block_hash, size = self._index.popitem(last=False)
            self.num_bytes -= size
            self.num_evictions += 1
            _unlink(self.path_of(block_hash))


def encode(arrays: list[np.ndarray], identity: str, block_hash: bytes) -> bytes:
    payload = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    header = {
        "identity": identity,
        "hash": block_hash.hex(),
        "checksum": hashlib.blake2b(payload).hexdigest(),
        "arrays": [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays],
    }
    head = json.dumps(header).encode()
    return MAGIC + _LEN.pack(len(head)) + head + payload


def decode(data: bytes, identity: str, block_hash: bytes, layout: Layout | None = None) -> list[np.ndarray]:
    """The arrays of a block file's bytes; raises BadBlockFile saying which check failed."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LEN.size:
        raise BadBlockFile("not a block file (bad magic)")
    start = len(MAGIC) + _LEN.size
    (head_len,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + head_len])
        specs = [(np.dtype(s["dtype"]), tuple(s["shape"])) for s in header["arrays"]]
        checks = (header["identity"], header["hash"], header["checksum"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BadBlockFile(f"unreadable header ({exc})") from None
    if checks[0] != identity:
        raise BadBlockFile(f"written for another model or KV format ({checks[0]!r})")
    if checks[1] != block_hash.hex():
        raise BadBlockFile("its header names another block")
    if layout is not None and specs != layout:
        raise BadBlockFile("its arrays' dtypes or shapes differ from this KV storage's")
    payload = memoryview(data)[start + head_len :]
    if hashlib.blake2b(payload).hexdigest() != checks[2]:
        raise BadBlockFile("checksum mismatch (truncated or corrupted)")
    arrays, offset = [], 0
    for dtype, shape in specs:
        size = dtype.itemsize * int(np.prod(shape))
        if offset + size > len(payload):
            raise BadBlockFile("payload shorter than its arrays")
        arrays.append(np.frombuffer(payload[offset : offset + size], dtype).reshape(shape))
        offset += size
    if offset != len(payload):
        raise BadBlockFile("payload longer than its arrays")
    return arrays


def _hash_of(name: str) -> bytes | None:
    if not name.endswith(SUFFIX):
        return None
    try:
        return bytes.fromhex(name.removesuffix(SUFFIX))
    except ValueError:
        return None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
