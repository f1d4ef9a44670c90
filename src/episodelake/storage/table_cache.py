"""The table cache: decoded columns of a local episode table, kept beside it and memory-mapped by later reads.

Two kinds of entries (uncompressed Arrow IPC under ``cache/``,
:func:`~episodelake.storage.layout.stats_cache_parts` and
:func:`~episodelake.storage.layout.keys_cache_parts`):

* **statistics** of one table file (:func:`stats_entry`): at a million
  episodes a view's first ``stats()`` spent most of its time decoding the
  statistics lists of the Parquet files holding the view (and faulting in
  the memory they decode into). Table files are immutable and uniquely
  named, so their decoded columns never go stale: the first read of a file
  writes them, every later read, in any process, maps them instead: no
  decode, no copy, pages the kernel may reclaim.
* **order keys** of one version (:func:`keys_entry`): each episode's
  ``(created_at, episode_id)`` in episode order, which a dataset's first
  ``where()`` places its matches by; reading and sorting them was most of
  it. One entry per kind of snapshot (quarantined or not), overwritten by
  the next version that reads them.

The cache is never the truth. An entry records what it was decoded from
(:class:`Entry` ``tags``: the table file and its byte size, or the version
and a digest of its file names), its row count and a checksum of its bytes;
one that is missing, truncated, damaged, stale or unreadable is ignored (the
caller decodes again and rewrites it). Entries are written by one background
thread per process (:func:`store_later`: writing 160 MB took as long as
decoding it), which the exit waits for (lifecycle stage ``cache writes``,
:func:`wait`), to a temporary sibling then renamed, so a crash leaves no
partial entry under an entry's name. :func:`prune` (run by every table
vacuum) removes the statistics of removed files and stale temporary files.
``EPISODELAKE_TABLE_CACHE=0`` turns the cache off; a dataset directory that
cannot be written to simply keeps none, and a read-only dataset writes none.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import struct
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core import lifecycle
from . import layout
from .location import Location

ROWS = b"episodelake.rows"  # schema metadata of every entry: its row count


@dataclass(frozen=True)
class Entry:
    """Where an entry lives (path parts under the root) and the tags it must carry to be valid."""

    parts: tuple[str, ...]
    tags: dict[bytes, bytes]


def enabled(loc: Location) -> bool:
    """Whether reads of ``loc``'s table use the cache: local datasets, unless ``EPISODELAKE_TABLE_CACHE=0``."""
    return loc.is_local and os.environ.get("EPISODELAKE_TABLE_CACHE", "1") != "0"


def source_path(loc: Location, file: str) -> str:
    """The table file ``file`` (its path relative to the table) on local disk."""
    return loc.child(*layout.table_parts(file))


def stats_entry(loc: Location, file: str) -> Entry | None:
    """The statistics entry of table file ``file``: valid for that file at its current size (None: it is gone)."""
    try:
        size = os.stat(source_path(loc, file)).st_size
    except OSError:
        return None
    tags = {b"episodelake.source": file.encode(), b"episodelake.bytes": b"%d" % size}
    return Entry(layout.stats_cache_parts(file), tags)


def keys_entry(version: int, files: Iterable[str], quarantined: bool) -> Entry:
    """The order-keys entry of a snapshot of ``version`` over table ``files`` (quarantined episodes, or the rest)."""
    digest = hashlib.sha256("\n".join(sorted(files)).encode()).hexdigest()
    tags = {b"episodelake.version": b"%d" % version, b"episodelake.files": digest.encode()}
    return Entry(layout.keys_cache_parts(quarantined), tags)


def load(loc: Location, entry: Entry) -> pa.Table | None:
    """The entry's columns, memory-mapped; None unless it is there, its bytes add up to the checksum written
    after them, and it carries ``entry.tags`` and its row count."""
    try:
        data = _checked(pa.memory_map(loc.child(*entry.parts)).read_buffer())
        if data is None:
            return None
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        meta = table.schema.metadata or {}
        if any(meta.get(k) != v for k, v in entry.tags.items()) or meta.get(ROWS) != b"%d" % table.num_rows:
            return None
    except (OSError, ValueError, pa.ArrowException):
        return None
    return table.replace_schema_metadata(None)


def store(loc: Location, entry: Entry, table: pa.Table) -> None:
    """Keep ``table`` as the entry. A failure to write (a read-only directory, a full disk) leaves no entry
    and is not an error."""
    path = loc.child(*entry.parts)
    temp = layout.temp_name(path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tagged = table.replace_schema_metadata({**entry.tags, ROWS: b"%d" % table.num_rows})
        with pa.OSFile(temp, "wb") as sink, pa.ipc.new_file(sink, tagged.schema) as writer:
            writer.write_table(tagged, max_chunksize=max(1, table.num_rows))
        total = _word_sum(pa.memory_map(temp).read_buffer())
        with open(temp, "ab") as fh:
            fh.write(struct.pack("<Q", total) + _MAGIC)
        os.replace(temp, path)
    except (OSError, pa.ArrowException):
        with contextlib.suppress(OSError):
            os.remove(temp)


def store_later(loc: Location, entry: Entry, table: pa.Table) -> None:
    """:func:`store` on the process's cache writer thread: the caller goes on with ``table`` meanwhile."""
    _writer().put((loc, entry, table))


def wait() -> None:
    """Return once every entry handed to :func:`store_later` in this process is written (or given up)."""
    writer = _WRITER
    if writer is not None and writer[0] == os.getpid():
        writer[1].join()


_WRITER: tuple[int, queue.Queue[tuple[Location, Entry, pa.Table]]] | None = None  # (pid, its queue)
_WRITER_LOCK = threading.Lock()


def _writer() -> queue.Queue[tuple[Location, Entry, pa.Table]]:
    """The queue of this process's writer thread, started on first use (a forked child starts its own)."""
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None or _WRITER[0] != os.getpid():
            todo: queue.Queue[tuple[Location, Entry, pa.Table]] = queue.Queue()
            threading.Thread(target=_write_all, args=(todo,), name="episodelake-table-cache", daemon=True).start()
            _WRITER = (os.getpid(), todo)
        return _WRITER[1]


def _write_all(todo: queue.Queue[tuple[Location, Entry, pa.Table]]) -> None:
    """The writer thread: never ends, whatever one entry raises (:func:`wait` at exit would wait forever)."""
    while True:
        loc, entry, table = todo.get()
        try:
            store(loc, entry, table)
        except Exception as exc:  # a bug, not a storage fault: said once per entry, the next ones still written
            warnings.warn(f"episodelake: table cache entry {'/'.join(entry.parts)} not written: {exc}", stacklevel=1)
        finally:
            todo.task_done()


# An entry is an Arrow IPC file followed by the wrapping sum of its bytes as little-endian 64-bit words (the
# last, short word zero-padded) and this tag. The sum runs at memory speed (about 6 ms per 80 MB here, where
# zlib's CRC-32 takes 55) and catches damaged or missing bytes, which is what a cache has to fear.
_MAGIC = b"ELSUM\x00\x00\x01"
_TRAILER = 8 + len(_MAGIC)


def _word_sum(data: pa.Buffer) -> int:
    words = np.frombuffer(data, dtype="<u8", count=data.size // 8)
    tail = bytes(data[data.size - data.size % 8 :]).ljust(8, b"\0")
    return (int(words.sum(dtype=np.uint64)) + struct.unpack("<Q", tail)[0]) % (1 << 64)


def _checked(data: pa.Buffer) -> pa.Buffer | None:
    """The IPC file of an entry's bytes, when its trailer is there and its sum matches (else None)."""
    if data.size < _TRAILER or bytes(data[data.size - len(_MAGIC) :]) != _MAGIC:
        return None
    body = data.slice(0, data.size - _TRAILER)
    (total,) = struct.unpack("<Q", bytes(data[body.size : body.size + 8]))
    return body if _word_sum(body) == total else None


def column(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column of an entry as NumPy: a view of the mapping (read-only) when it is one chunk."""
    col = table.column(name)
    return (col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()).to_numpy()


def prune(loc: Location, older_than_s: float) -> None:
    """Remove the statistics of table files that are gone, and temporary files older than ``older_than_s``."""
    cache = loc.child(*layout.CACHE)
    if not loc.is_local or not os.path.isdir(cache):
        return
    stats = loc.child(*layout.stats_cache_parts())
    table = loc.child(*layout.table_parts())
    cutoff = time.time() - older_than_s
    for folder, _, names in os.walk(cache):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(layout.TEMP_SUFFIX):
                doomed = _mtime(path) < cutoff
            elif name.endswith(layout.CACHE_SUFFIX) and path.startswith(stats + "/"):
                source = os.path.relpath(path, stats).removesuffix(layout.CACHE_SUFFIX)
                doomed = not os.path.exists(os.path.join(table, source))
            else:
                doomed = False
            if doomed:
                with contextlib.suppress(FileNotFoundError):  # a concurrent vacuum removed it first
                    os.remove(path)


def _mtime(path: str) -> float:
    """A file's modification time; +inf when it is gone (a temporary file renamed meanwhile)."""
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")


lifecycle.on_exit("cache writes", wait)  # entries the last stats() decoded are written whole before exit
