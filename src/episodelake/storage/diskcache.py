"""Caches of immutable byte ranges: bounded on disk (shared by every process of a node) or in memory.

Objects of a committed dataset never change (tensor shards are written once,
see ``arrays.py``), so a cached byte range is valid forever and is never
revalidated. Keys name the object and the range (plus the dataset's creation
stamp, so a dataset deleted and recreated at the same URL never hits the old
entries).

**On disk** (:class:`DiskCache`), one file per entry under
``<dir>/<2 hex>/<30 hex>`` (a hash of the key). An entry is the content
followed by a 12-byte trailer: CRC-32 of the content (``<u4``) and its length
(``<u8``).

* Creation is atomic: the entry is written to a temporary file in the cache
  directory and renamed into place, so a reader sees a whole entry or none;
  two processes filling the same entry both rename the same bytes.
* Checked: an entry is verified (length and CRC-32) when a process first
  maps it; a mismatch (flipped bits, truncation) deletes the file and counts
  as a miss, so the caller refetches it. A bad entry is never returned.
* Reads are zero-copy: a verified entry is memory-mapped and handed out as a
  read-only ``uint8`` array (kept mapped by the process, up to
  :data:`MAX_MAPPED` entries).
* Bounded, LRU: an entry's modification time is its last use (a process
  touches an entry when it maps it and again at most every
  :data:`TOUCH_EVERY_S` of further use). A process that has added more than
  ``max_bytes / 8`` since it last looked, or whose estimate of the total
  passes ``max_bytes``, scans the directory and deletes the least recently
  used entries until the total is under ``0.9 * max_bytes`` (one evictor at a
  time, under an ``flock``). Deleting an entry another process has mapped is
  safe: its mapping stays valid. The total may pass the bound by up to
  ``max_bytes / 8`` per process adding entries concurrently.

**In memory** (:class:`MemoryCache`): an LRU of byte ranges per process,
bounded by its size in bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

TRAILER = struct.Struct("<IQ")  # CRC-32 of the content, content length
MAX_MAPPED = 4096  # entries a process keeps mapped (each mapping is one of vm.max_map_count's ~65k)
TOUCH_EVERY_S = 60.0  # how often a process refreshes the last-use time of an entry it keeps using
EVICT_TO = 0.9  # an eviction leaves the cache at this fraction of its bound
TEMP_PREFIX = ".tmp-"
LOCK_NAME = ".evict.lock"


@dataclass(frozen=True)
class CacheConfig:
    """Where a dataset's reads are cached: ``directory`` (None: in memory only), bounded by ``max_bytes``.

    ``namespace`` identifies the dataset's incarnation (its creation stamp).
    """

    directory: str | None
    max_bytes: int
    namespace: str = ""


def entry_name(key: str) -> str:
    """The entry file's path under the cache directory (two levels: 256 subdirectories)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return os.path.join(digest[:2], digest[2:32])


class DiskCache:
    """A bounded on-disk cache of immutable byte ranges (see the module docstring)."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        self.max_bytes = int(max_bytes)
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()
        self._mapped: OrderedDict[str, tuple[np.ndarray, float]] = OrderedDict()
        self._total = -1  # bytes on disk at the last scan (-1: not scanned yet)
        self._added = 0  # bytes this process added since
        self.hits = self.misses = self.corrupt = 0

    def get(self, key: str) -> np.ndarray | None:
        """The content of ``key`` (a read-only ``uint8`` array), or None when absent or damaged (then deleted)."""
        path = os.path.join(self.directory, entry_name(key))
        now = time.monotonic()
        with self._lock:
            found = self._mapped.get(path)
            if found is not None:
                self._mapped.move_to_end(path)
                self.hits += 1
                if now - found[1] > TOUCH_EVERY_S:
                    self._mapped[path] = (found[0], now)
                    _touch(path)
                return found[0]
        data = self._map(path)
        with self._lock:
            if data is None:
                self.misses += 1
                return None
            self.hits += 1
            self._mapped[path] = (data, now)
            if len(self._mapped) > MAX_MAPPED:
                self._mapped.popitem(last=False)
        _touch(path)
        return data

    def _map(self, path: str) -> np.ndarray | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < TRAILER.size:
                self._bad(path)
                return None
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        crc, length = TRAILER.unpack_from(mm, size - TRAILER.size)
        data = np.frombuffer(mm, np.uint8, count=size - TRAILER.size)
        if length != len(data) or zlib.crc32(data.data) != crc:
            del data
            mm.close()
            self._bad(path)
            return None
        return data

    def _bad(self, path: str) -> None:
        with self._lock:
            self.corrupt += 1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def put(self, key: str, content: bytes | memoryview | np.ndarray) -> None:
        """Store ``content`` under ``key`` (atomically: write a temporary file, then rename it into place)."""
        path = os.path.join(self.directory, entry_name(key))
        view = (content.data if isinstance(content, np.ndarray) else memoryview(content)).cast("B")
        tmp = os.path.join(self.directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(view)
                fh.write(TRAILER.pack(zlib.crc32(view), len(view)))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.rename(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return  # a full or read-only cache directory costs speed, never a read
        with self._lock:
            self._added += len(view) + TRAILER.size
            due = self._total < 0 or self._added > self.max_bytes // 8 or self._total + self._added > self.max_bytes
        if due:
            self.evict()

    def evict(self) -> None:
        """Scan the directory; if over the bound, delete least recently used entries down to ``EVICT_TO`` of it."""
        with open(os.path.join(self.directory, LOCK_NAME), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process is evicting right now
            try:
                entries, total = self.scan()
                if total > self.max_bytes:
                    entries.sort()
                    goal = int(self.max_bytes * EVICT_TO)
                    for _, size, path in entries:
                        if total <= goal:
                            break
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                        total -= size
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        with self._lock:
            self._total, self._added = total, 0

    def scan(self) -> tuple[list[tuple[float, int, str]], int]:
        """``([(last use, size, path)], total bytes)`` of the entries on disk now."""
        entries = []
        for sub in os.scandir(self.directory):
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime, st.st_size, entry.path))
        return entries, sum(size for _, size, _ in entries)


def _touch(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)


class MemoryCache:
    """A per-process LRU of immutable byte ranges, bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._size = 0
        self.hits = self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: str, content: np.ndarray) -> None:
        if content.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self._size -= 0 if old is None else old.nbytes
            self._items[key] = content
            self._size += content.nbytes
            while self._size > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._size -= dropped.nbytes
