"""Batched reads: row windows of many episodes gathered into reusable buffers.

One primitive serves segments, padded segments, frame stacks and action
chunks: for ``B`` episodes and a ``[B, W]`` matrix of episode-relative row
numbers, fill ``out[B, W, *shape]`` with the field's rows, and zeros where a
row number falls outside the episode (padding).

* Small per-step fields are one vectorized ``np.take`` from the snapshot's
  contiguous in-memory arrays.
* Local arrays with the raw ``bytes`` codec (no compression, no sharding)
  are read from a **resident copy** in process memory (:class:`ResidentRows`,
  one anonymous buffer per array): each row is read from its chunk file the
  first time a batch needs it (a chunk found in the page cache whole; each
  chunk file's identity checked the first time a reader touches it), and a
  batch is one ``np.take`` of its rows into the batch buffer, shared with
  pool threads when large (NumPy releases the GIL while copying): no
  per-segment Python, no file mapping's page tables, and no system call
  once the rows are resident. Resident copies are bounded per process by
  :data:`RESIDENT_BYTES` (``EPISODELAKE_RESIDENT_MB``); arrays that do not
  fit are read as below.
* Other tensor fields are split into runs of consecutive rows inside one
  chunk. Raw local arrays outside the resident budget are read zero-copy
  from memory-mapped chunk files, one ``memcpy`` per run, with the kernel
  page cache as the chunk cache; a warm batch makes no system call (rows are
  announced to the kernel once per process). Everything else (compressed
  chunks, object stores) goes through TensorStore, every run of the batch
  issued at once in one ``ts.Batch`` so reads of the same chunk or shard are
  coalesced.
* Output buffers come from a :class:`BufferPool` and are reused once nothing
  references them any more: a batch the caller still holds is never
  overwritten, and a dropped one is recycled instead of re-faulting fresh
  pages every batch (a fresh ~26 MB array per batch costs ~3x).

A snapshot's :class:`WindowReader` (:func:`reader_for`) is built once and kept
in ``Snapshot.window_reader``. It is picklable (spawned workers get the loaded NumPy
state and reopen files lazily) and works in forked workers: readers opened
before a fork are dropped in the child, and since TensorStore aborts a process
that uses it after ``fork()``, a forked worker reads compressed and
object-store arrays through :class:`~episodelake.storage.planned.PlainArray`.
"""

from __future__ import annotations

import copy
import ctypes
import itertools
import math
import mmap
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from ..core import lifecycle
from ..core.codecs import codec_pool
from ..core.episode import EpisodeBatch, extra_rows, rows_for
from ..core.errors import CorruptionError
from ..core.growable import append_rows
from ..core.schema import FieldSpec
from ..core.segments import Segment, meta_fill
from ..storage.arrays import COMMIT_SHIFT, ROW_MASK, array_parts, mappable_layout
from ..storage.faults import storage_fault
from ..storage.layout import chunk_parts
from ..storage.location import Location
from ..storage.planned import PlainArray, copy_runs_many
from ..storage.tensors import TensorArray
from .snapshot import Snapshot

MAX_MAPPED_CHUNKS = 8192  # bound on cached chunk mappings per array (vm.max_map_count is ~65k)


PAGE = mmap.PAGESIZE
SMALL_BYTES = 1 << 16  # batch buffers below this are fresh arrays, not pooled


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, array)``: an uninitialized array starting on a page boundary, and the allocation owning it.

    Page alignment matters: copying page-aligned file rows into a buffer that
    starts 16 bytes past a page (what ``np.empty`` gets from ``malloc`` for
    large sizes) runs ~2.5x slower (4K aliasing between loads and stores).
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    owner = np.empty(nbytes + PAGE, np.uint8)
    off = -owner.ctypes.data % PAGE
    return owner, owner[off : off + nbytes].view(dtype).reshape(shape)


class BufferPool:
    """Uninitialized page-aligned buffers, handed out again once only the pool references them.

    A buffer is reusable when reference counts show that no array view,
    batch or tensor (``torch.from_numpy`` keeps a reference) still points at
    it or at its allocation (NumPy views reference the allocation directly).
    At most ``keep`` buffers per shape are retained.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._buffers: dict[tuple[tuple[int, ...], str], list[tuple[np.ndarray, np.ndarray]]] = {}

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            entries = self._buffers.setdefault(key, [])
            for entry in entries:
                # owner: the entry, buf.base and getrefcount's argument; buf: the entry and the argument
                if sys.getrefcount(entry[0]) == 3 and sys.getrefcount(entry[1]) == 2:
                    return entry[1]
            entry = aligned_empty(shape, dtype)
            if len(entries) < self.keep:
                entries.append(entry)
            return entry[1]


class Buffers(Protocol):
    """What hands out a batch's output buffers (:class:`BufferPool`, or a shared-memory slot's arena)."""

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialized C-contiguous array of ``shape`` and ``dtype`` that nothing else writes now."""
        ...


def _default_resident_bytes() -> int:
    """An eighth of physical memory, at most 4 GiB (``EPISODELAKE_RESIDENT_MB`` overrides it; 0 turns it off)."""
    configured = os.environ.get("EPISODELAKE_RESIDENT_MB")
    if configured is not None:
        return int(float(configured) * (1 << 20))
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # no sysconf names (not POSIX)
        return 0
    return min(physical // 8, 4 << 30)


RESIDENT_BYTES = _default_resident_bytes()  # per-process bound on the resident copies of local arrays
RESIDENT_IDLE_S = 60.0  # a resident copy unused this long may be evicted to make room for another


def _mem_available() -> int | None:
    """The kernel's estimate of memory available without swapping (Linux), else None."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


_libc = ctypes.CDLL(None, use_errno=True)
_mincore = getattr(_libc, "mincore", None)


def in_page_cache(fd: int, size: int) -> bool:
    """Whether every page of the first ``size`` bytes of file ``fd`` is in the page cache (``mincore``).

    Maps the file without touching it (no page fault, no readahead); False
    where ``mincore`` is not available.
    """
    if _mincore is None or size == 0:
        return False
    mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    try:
        view = np.frombuffer(mm, np.uint8)
        pages = np.empty(-(-size // PAGE), np.uint8)
        ok = _mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), ctypes.c_void_p(pages.ctypes.data))
        del view
        return ok == 0 and bool((pages & 1).all())
    finally:
        mm.close()


Stamp = tuple[int, int, int, int]  # (device, inode, size, mtime ns) of a chunk file when it was read


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _anonymous(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed, page-aligned array in its own anonymous mapping (unmapped when the array is dropped).

    Not NumPy's allocator: NumPy asks for transparent huge pages on large
    arrays, and faulting in a resident copy's 2 MiB pages (zeroed, compacted)
    costs about twice its 4 KiB ones, for no faster copies out of it.
    """
    count = math.prod(shape)
    buf = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))
    return np.frombuffer(buf, dtype, count).reshape(shape)


class ResidentRows:
    """One local raw array's rows in process memory, each read from its chunk file the first time a batch needs it.

    ``rows`` (None once evicted) is a buffer of whole chunks and ``filled``
    says which of its rows were read, from chunk ``c``'s file as it was when
    ``stamps[c]`` was taken. A local array only ever grows at its end and
    rows already referenced never change, so a copy stays right for every
    snapshot; a chunk file whose identity changed (the last chunk rewritten
    by a later commit, a replaced or damaged file) has its rows read again.
    Rows are read like the mapped path reads them: only those a batch needs,
    all of a batch's announced to the kernel first so that cold ones are read
    concurrently. Grows (:meth:`ResidentCache.rows_of`) by swapping the
    buffer, so readers holding this object see the larger one.
    """

    def __init__(self, field: FieldSpec, chunk_rows: int, capacity: int) -> None:
        self.field = field
        self.chunk_rows = chunk_rows
        self.rows: np.ndarray | None = _anonymous((capacity, *field.shape), field.np_dtype)
        self.filled = np.zeros(capacity, dtype=bool)
        self.stamps: dict[int, Stamp] = {}
        self.used = time.monotonic()
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.nbytes

    @property
    def capacity(self) -> int:
        return 0 if self.rows is None else len(self.rows)

    def grow(self, capacity: int) -> None:
        """Hold ``capacity`` rows from now on, the rows read so far kept."""
        with self.lock:
            assert self.rows is not None and capacity > self.capacity
            rows = _anonymous((capacity, *self.field.shape), self.field.np_dtype)
            rows[: self.capacity] = self.rows
            filled = np.zeros(capacity, dtype=bool)
            filled[: self.capacity] = self.filled
            self.rows, self.filled = rows, filled

    def check(self, files: ChunkFiles, chunks: np.ndarray, episodes: np.ndarray) -> None:
        """``stat`` chunks ``chunks`` (``episodes[i]``: an episode with rows in ``chunks[i]``, for errors).

        A missing or mis-sized file raises as the mapped path does; a file
        whose identity changed since its rows were read has them read again.
        """
        R = self.chunk_rows
        with self.lock:
            for c, eid in zip(chunks.tolist(), episodes.tolist(), strict=True):
                with files.failures(c, eid) as path:
                    st = os.stat(path)
                files.check_size(path, st.st_size, eid)
                if self.stamps.get(c) != _stamp(st):
                    self.stamps[c] = _stamp(st)
                    self.filled[c * R : (c + 1) * R] = False

    def fill(self, files: ChunkFiles, src: np.ndarray, episodes: np.ndarray) -> None:
        """Read the rows ``src`` not read yet (``episodes[i]``: the episode of ``src[i]``, for errors).

        A chunk whose file is all in the page cache (:func:`in_page_cache`) is
        read whole, so a warm array is resident once each chunk was touched;
        otherwise only the rows needed are read (no more from storage than
        the mapped path reads), all of them announced to the kernel first so
        that they are read concurrently.
        """
        R, row = self.chunk_rows, self.field.step_bytes
        with self.lock:
            rows, filled = self.rows, self.filled
            if rows is None:  # evicted: the caller maps the files
                return
            missing = ~filled[src]
            need, first = np.unique(src[missing], return_index=True)
            if not len(need):
                return
            owner = dict(zip(need.tolist(), episodes[missing][first].tolist(), strict=True))
            flat = rows.reshape(len(rows), -1).view(np.uint8)
            opened: dict[int, int] = {}
            try:
                for c in np.unique(need // R).tolist():
                    eid = owner[int(need[np.searchsorted(need, c * R)])]
                    with files.failures(c, eid) as path:
                        fd = opened[c] = os.open(path, os.O_RDONLY)
                        if in_page_cache(fd, R * row) and os.preadv(fd, [flat[c * R : (c + 1) * R].data], 0) == R * row:
                            filled[c * R : (c + 1) * R] = True
                need = need[~filled[need]]
                brk = (np.diff(need) != 1) | (np.diff(need // R) != 0)
                starts = np.concatenate([[0], np.flatnonzero(brk) + 1])[: len(need)]
                counts = np.diff(np.append(starts, len(need)))
                runs = [(s // R, s, n, owner[s]) for s, n in zip(need[starts].tolist(), counts.tolist(), strict=True)]
                for c, s, n, eid in runs:
                    with files.failures(c, eid):
                        if hasattr(os, "posix_fadvise"):  # cold rows of the batch read concurrently
                            os.posix_fadvise(opened[c], (s - c * R) * row, n * row, os.POSIX_FADV_WILLNEED)
                for c, s, n, eid in runs:
                    with files.failures(c, eid) as path:
                        got = os.preadv(opened[c], [flat[s : s + n].data], (s - c * R) * row)
                        if got != n * row:  # shrank since it was checked
                            files.check_size(path, os.fstat(opened[c]).st_size, eid)
                            raise CorruptionError(f"episode {eid}: chunk file {path}: read {got} of {n * row} bytes")
            finally:
                for fd in opened.values():
                    os.close(fd)
            filled[need] = True


class ResidentCache:
    """The process's resident copies of local raw arrays (:class:`ResidentRows`), by array directory.

    Their capacities add up to at most ``budget`` bytes; a copy is only made
    (or grown) while it is at most half of the memory the kernel reports
    available. To make room, copies unused for :data:`RESIDENT_IDLE_S` are
    evicted (their readers go back to mapping the files); an array that does
    not fit is not made resident.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._arrays: dict[tuple[Any, ...], ResidentRows] = {}  # by (directory, chunk rows, dtype, row shape)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held by resident copies now."""
        return sum(r.nbytes for r in self._arrays.values())

    def rows_of(self, files: ChunkFiles) -> ResidentRows | None:
        """The resident copy of ``files``' array, made or grown to hold its rows; None if it does not fit."""
        R, f = files.chunk_rows, files.field
        capacity = -(-files.rows // R) * R
        key = (files.directory, R, f.np_dtype.str, f.shape)
        with self._lock:
            entry = self._arrays.get(key)
            if entry is not None and entry.capacity >= capacity:
                return entry
            if entry is not None:  # by a quarter at least: an array followed while it grows is copied rarely
                capacity = max(capacity, -(-entry.capacity * 5 // 4 // R) * R)
            more = capacity * f.step_bytes - (entry.nbytes if entry is not None else 0)
            available = _mem_available()
            if (available is not None and capacity * f.step_bytes > available // 2) or not self._make_room(more, key):
                return None
            if entry is None:
                entry = self._arrays[key] = ResidentRows(f, R, capacity)
            else:
                entry.grow(capacity)
            return entry

    def _make_room(self, more: int, keep: tuple[Any, ...]) -> bool:
        free = self.budget - self.nbytes
        if more <= free:
            return True
        idle = time.monotonic() - RESIDENT_IDLE_S
        for key, entry in sorted(self._arrays.items(), key=lambda item: item[1].used):
            if free >= more or entry.used > idle:
                break
            if key != keep:
                free += entry.nbytes
                entry.rows = None  # its readers see it evicted and map the files again
                del self._arrays[key]
        return more <= free

    def reset_after_fork(self) -> None:
        """Fresh locks (a parent thread may have held them); the copies stay, shared copy-on-write."""
        self._lock = threading.Lock()
        for entry in self._arrays.values():
            entry.lock = threading.Lock()


resident = ResidentCache(RESIDENT_BYTES)


class ChunkFiles:
    """Reads of a local Zarr v3 array stored with the raw ``bytes`` codec: from its resident copy, else mapped.

    Chunk ``c`` is the file ``c/<c>/0/...`` holding ``chunk_rows`` rows in C
    order. The array is made resident (:class:`ResidentCache`) when the
    reader is made, if it fits; :meth:`gather` copies from that copy,
    :meth:`copy_runs` from memory-mapped chunk files.
    """

    def __init__(self, directory: str, rows: int, chunk_rows: int, field: FieldSpec) -> None:
        self.directory = directory
        self.where = directory
        self.rows = rows
        self.chunk_rows = chunk_rows
        self.field = field
        self.row_shape = field.shape
        self.dataset = ""  # named by storage faults
        self._maps: dict[int, tuple[mmap.mmap, np.ndarray]] = {}
        self._seen: np.ndarray | None = None  # rows this process read (pages announced to the kernel already)
        self._resident = resident.rows_of(self)
        self._checked = np.zeros(-(-rows // chunk_rows), dtype=bool)  # chunks of the resident copy checked

    @classmethod
    def probe(cls, loc: Location, writer: str, field: FieldSpec) -> ChunkFiles | None:
        """A reader for ``writer``'s single local array of ``field`` if it allows zero-copy reads, else None."""
        found = mappable_layout(loc, writer, field)
        if found is None:
            return None
        rows, chunk_rows = found
        files = cls(loc.child(*array_parts(writer, field)), rows, chunk_rows, field)
        files.dataset = loc.url
        return files

    @contextmanager
    def failures(self, c: int, episode_id: int) -> Iterator[str]:
        """Chunk ``c``'s path; file errors inside raise what damaged or failing storage does.

        Every chunk of referenced rows is stored (even all-zero ones), so a
        missing file is :class:`CorruptionError`; permission denied or an
        I/O error is a storage fault (:class:`StorageError`).
        """
        path = os.path.join(self.directory, *chunk_parts(c, len(self.row_shape)))
        try:
            yield path
        except FileNotFoundError as exc:
            raise CorruptionError(
                f"episode {episode_id}: field {self.field.key!r}: chunk file {path} is missing"
            ) from exc
        except OSError as exc:  # CorruptionError passes
            err = storage_fault(exc, dataset=self.dataset, object=path, doing=f"reading episode {episode_id}")
            if err is None:
                raise
            raise err from exc

    def check_size(self, path: str, size: int, episode_id: int) -> None:
        """Raise :class:`CorruptionError` unless ``size`` is a whole chunk's."""
        want = self.chunk_rows * self.field.step_bytes
        if size != want:
            raise CorruptionError(
                f"episode {episode_id}: field {self.field.key!r}: chunk file {path} holds {size} bytes, expected {want}"
            )

    def chunk(self, c: int, episode_id: int) -> tuple[mmap.mmap, np.ndarray]:
        """Chunk ``c``'s mapping and its rows as a read-only array over it."""
        try:
            return self._maps[c]
        except KeyError:
            pass
        with self.failures(c, episode_id) as path, open(path, "rb") as fh:
            self.check_size(path, os.fstat(fh.fileno()).st_size, episode_id)
            mm = mmap.mmap(fh.fileno(), self.chunk_rows * self.field.step_bytes, prot=mmap.PROT_READ)
        entry = (mm, np.frombuffer(mm, self.field.np_dtype).reshape(self.chunk_rows, *self.row_shape))
        if len(self._maps) >= MAX_MAPPED_CHUNKS:
            self._maps.clear()  # dropped mappings unmap once no batch copy is in flight
        self._maps[c] = entry
        return entry

    def gather(
        self, out: np.ndarray, src: np.ndarray, dst: np.ndarray | None, episodes: np.ndarray, width: int
    ) -> bool:
        """``out[dst] = rows src`` (``dst`` None: every row of ``out``) from the array's resident copy.

        ``episodes[i]`` is the episode of ``out``'s rows ``[i * width, (i + 1)
        * width)`` (named by errors). Chunks this reader has not touched yet
        are checked first, rows not read yet are read, so a warm batch is one
        ``np.take`` and no system call. False, nothing copied, when the array
        is not resident (:class:`ResidentCache`): the caller copies runs
        (:meth:`copy_runs`).
        """
        entry = self._resident
        if entry is None:
            return False
        entry.used = time.monotonic()
        chunks = src // self.chunk_rows
        fresh = ~self._checked[chunks]
        if fresh.any() or not entry.filled[src].all():
            owners = episodes[(np.arange(len(src)) if dst is None else dst) // width]
            if fresh.any():
                todo, first = np.unique(chunks[fresh], return_index=True)
                entry.check(self, todo, owners[fresh][first])
                self._checked[todo] = True
            entry.fill(self, src, owners)
        rows = entry.rows  # after the fill: a buffer grown meanwhile holds the rows too
        if rows is None:  # evicted: map the files from now on
            self._resident = None
            return False
        if dst is None:
            take_rows(out, rows, src)
        else:
            out[dst] = rows[src]
        return True

    def copy_runs(self, out: np.ndarray, runs: list[tuple[int, int, int, int]]) -> None:
        """Copy runs ``(dst row, src row, count, episode id)`` (each inside one chunk) into ``out``.

        The byte ranges of runs this process has not read before are announced
        with ``MADV_WILLNEED`` before the first copy, so rows not in the page
        cache are read concurrently (and only those bytes) instead of one page
        fault at a time; rows read once are not announced again (warm batches
        make no system call). Batches of at least :data:`PARALLEL_BYTES` are
        copied by several threads (NumPy releases the GIL while copying).
        """
        R, row = self.chunk_rows, self.field.step_bytes
        if self._seen is None:
            self._seen = np.zeros(self.rows, dtype=bool)
        seen = self._seen
        todo = []
        for dst, src, n, eid in runs:
            c, r = divmod(src, R)
            entry = self.chunk(c, eid)
            if not (seen[src] and seen[src + n - 1]):
                lo = r * row - r * row % PAGE
                entry[0].madvise(mmap.MADV_WILLNEED, lo, (r + n) * row - lo)
                seen[src : src + n] = True
            todo.append((dst, entry[1], r, n))
        parallel_copy(out, todo, sum(n for *_, n in todo) * row)


def _copy_blocks(out: np.ndarray, todo: list[tuple[int, np.ndarray, int, int]]) -> None:
    for dst, block, r, n in todo:
        out[dst : dst + n] = block[r : r + n]


PARALLEL_BYTES = 4 << 20  # below this, handing copies to threads costs more than it saves
COPY_THREADS = max(1, min(4, os.cpu_count() or 1))  # memory bandwidth saturates at a few cores


def parallel_copy(out: np.ndarray, todo: list[tuple[int, np.ndarray, int, int]], nbytes: int) -> None:
    """``out[dst : dst + n] = block[r : r + n]`` for each ``(dst, block, r, n)``, split over threads if large."""
    workers = min(len(todo), COPY_THREADS, nbytes // (PARALLEL_BYTES // 2))
    if workers < 2:
        _copy_blocks(out, todo)
        return
    parts = [todo[i::workers] for i in range(workers)]
    pool = codec_pool()
    futures = [pool.submit(_copy_blocks, out, part) for part in parts[1:]]
    _copy_blocks(out, parts[0])
    for fut in futures:
        fut.result()


PARTS_PER_THREAD = 4  # a large take is cut into this many parts per thread, claimed by whichever thread is free
SOLO_CALLS = 50  # takes copied by the caller alone after a helper stalled (a busy machine), before trying again
_solo = [0]  # takes left to copy alone


def take_rows(out: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``out[:] = rows[src]`` (``src`` within ``rows``), shared with pool threads if large.

    The copy is cut into parts that the calling thread and the helpers claim
    one at a time, and the caller waits only for parts a helper claimed. On a
    busy machine a helper may be descheduled in the middle of its part; when
    the caller waited for one longer than two parts' copy, the next
    :data:`SOLO_CALLS` takes are copied by the caller alone.
    """
    workers = min(len(src), COPY_THREADS, out.nbytes // (PARALLEL_BYTES // 2))
    if workers < 2 or _solo[0] > 0:
        _solo[0] = max(0, _solo[0] - 1)
        np.take(rows, src, axis=0, out=out, mode="clip")  # "clip": with mode "raise" NumPy copies twice
        return
    parts = workers * PARTS_PER_THREAD
    cuts = [len(src) * k // parts for k in range(parts + 1)]
    claims = itertools.count()  # next() is atomic: each part is claimed once
    done = threading.Semaphore(0)
    failed: list[BaseException] = []

    def work() -> None:
        while (k := next(claims)) < parts:
            try:
                a, b = cuts[k], cuts[k + 1]
                np.take(rows, src[a:b], axis=0, out=out[a:b], mode="clip")
            except BaseException as exc:  # re-raised by the caller
                failed.append(exc)
            finally:
                done.release()

    pool = codec_pool()
    for _ in range(workers - 1):
        pool.submit(work)
    began = time.perf_counter()
    work()
    copied = time.perf_counter()
    for _ in range(parts):
        done.acquire()
    if (time.perf_counter() - copied) * parts > 4 * (copied - began):  # about two parts' copy
        _solo[0] = SOLO_CALLS
    if failed:
        raise failed[0]


Source = ChunkFiles | TensorArray | PlainArray


class TensorField:
    """One tensor field of a snapshot: per-episode array and first row, one reader per array, opened on demand.

    An array is a writer's single array (commit 0) or one commit's array
    (object stores); ``array_of[p]`` numbers episode ``p``'s array and
    ``rows[p]`` is its first row there.
    """

    def __init__(self, snap: Snapshot, field: FieldSpec) -> None:
        self.field = field
        refs = snap.index[f"ref/{field.key}"].astype(np.int64)
        writers, writer_of = np.unique(snap.index["writer"].astype(str), return_inverse=True)
        keys, array_of = np.unique(
            (writer_of.astype(np.int64) << COMMIT_SHIFT) | (refs >> COMMIT_SHIFT), return_inverse=True
        )
        self.arrays = [(str(writers[k >> COMMIT_SHIFT]), int(k & ROW_MASK)) for k in keys.tolist()]
        self.array_of = array_of.astype(np.int64)
        self.rows = refs & ROW_MASK
        self.verified = np.zeros(len(refs), dtype=bool)  # CRC-checked episodes (Dataset.open(verify=True))
        self._snap = snap
        self._sources: dict[int, Source] = {}
        self._pid = os.getpid()
        self._ends: np.ndarray | None = None

    def sources(self, needed: np.ndarray, nrows: np.ndarray) -> dict[int, Source]:
        """Readers of arrays ``needed`` (numbers), opened together on first use in this process.

        Local single arrays stored raw are memory-mapped; everything else is
        read through TensorStore, or in a process forked from one that used
        TensorStore through :class:`PlainArray`. Readers never cross a fork.
        """
        if self._pid != os.getpid():
            self._sources, self._pid = {}, os.getpid()
        missing = [a for a in np.unique(needed).tolist() if a not in self._sources]
        if not missing:
            return self._sources
        snap, f = self._snap, self.field
        if self._ends is None:
            self._ends = np.zeros(len(self.arrays), np.int64)
            np.maximum.at(self._ends, self.array_of, self.rows + nrows)
        opened: dict[int, Source | None] = {}
        for a in missing:
            writer, commit = self.arrays[a]
            local_single = snap.loc.is_local and commit == 0
            opened[a] = ChunkFiles.probe(snap.loc, writer, f) if local_single else None
        rest = [a for a, src in opened.items() if src is None]
        try:
            for a, arr in zip(rest, snap.tensor_arrays(f, [self.arrays[a] for a in rest]), strict=True):
                opened[a] = arr
        except CorruptionError as exc:
            eid = int(snap.index["episode_id"][np.flatnonzero(np.isin(self.array_of, rest))[0]])
            raise CorruptionError(f"episode {eid}: field {f.key!r}: {exc}") from exc
        for a, src in opened.items():
            assert src is not None
            if self._ends[a] > src.rows:
                p = int(np.flatnonzero((self.array_of == a) & (self.rows + nrows > src.rows))[0])
                raise CorruptionError(
                    f"episode {int(snap.index['episode_id'][p])}: field {f.key!r} references rows "
                    f"[{self.rows[p]}, {self.rows[p] + nrows[p]}) but {src.where} has {src.rows} rows"
                )
            self._sources[a] = src
        return self._sources

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sources": {}}


def typed_meta(values: np.ndarray, f: FieldSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(values, valid)`` of a snapshot meta column for batches: never an object array for numbers.

    Unset (None) entries of a numeric/bool field become :func:`meta_fill` of its
    dtype with ``valid`` False; strings stay an object array of ``str``/None.
    """
    n = len(values)
    if values.dtype != object:
        return values, np.ones(n, dtype=bool)
    valid = np.fromiter((v is not None for v in values), bool, n)
    if f.np_dtype.kind == "U":
        return values, valid
    out = np.full((n, *f.shape), meta_fill(f.np_dtype), dtype=f.np_dtype)
    if valid.any():
        out[valid] = np.stack([np.asarray(v, f.np_dtype) for v in values[valid]])
    return out, valid


class WindowReader:
    """Gathers row windows of a snapshot's episodes into batch buffers (see module docstring).

    Everything it needs from the table (index, small fields, meta) is loaded
    at construction, so worker processes never touch the Delta table.
    """

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.schema = snap.schema
        idx = snap.index
        self.lengths = snap.lengths
        self.episode_ids = idx["episode_id"].astype(np.int64)
        self.terminated = idx["terminated"].astype(bool)
        self.truncated = idx["truncated"].astype(bool)
        typed = {f.name: typed_meta(snap.index[f.key], f) for f in self.schema.meta_fields}
        self.meta = {name: values for name, (values, _) in typed.items()}
        self.meta_valid = {name: valid for name, (_, valid) in typed.items()}
        self._table = {f.key: snap.table_field(f) for f in self.schema.table_step_fields}
        # each episode's first row in the table fields' arrays, by extra rows (see rows_for)
        self._base = {extra_rows(f): snap.offsets(f)[:-1] for f in self.schema.step_fields}
        self._tensor = {f.key: TensorField(snap, f) for f in self.schema.tensor_fields}
        self._init_process()

    def followed_by(self, batch: EpisodeBatch, ids: np.ndarray) -> WindowReader:
        """A reader of this one's episodes and then ``batch``'s, not yet committed (table step fields only).

        Position ``len(self.lengths) + i`` reads episode ``i`` of ``batch``,
        whose id is ``ids[i]``, as a committed one would read. This reader
        is left as it is; the new one's arrays grow in place when it is
        extended again (:func:`~episodelake.core.growable.append_rows`), so
        a stream following a writer pays for each new episode's rows once.
        """
        if self._tensor:
            raise ValueError("followed_by: tensor fields are read from their arrays, which hold committed rows only")
        out = copy.copy(self)
        out.lengths = append_rows(self.lengths, batch.lengths)
        out.episode_ids = append_rows(self.episode_ids, ids)
        out.terminated = append_rows(self.terminated, batch.terminated)
        out.truncated = append_rows(self.truncated, batch.truncated)
        out.meta, out.meta_valid = dict(self.meta), dict(self.meta_valid)
        for f in self.schema.meta_fields:
            values, valid = batch.meta[f.name]
            if f.np_dtype.kind == "U":  # str/None objects, as typed_meta keeps them
                values = values.astype(object)
                values[~valid] = None
            else:
                values = np.where(valid.reshape(-1, *(1,) * len(f.shape)), values, meta_fill(f.np_dtype))
            out.meta[f.name] = append_rows(self.meta[f.name], values.astype(self.meta[f.name].dtype))
            out.meta_valid[f.name] = append_rows(self.meta_valid[f.name], valid)
        out._table = {key: append_rows(values, batch.data[key]) for key, values in self._table.items()}
        out._base = {}
        for extra, starts in self._base.items():
            total = int(starts[-1] + self.lengths[-1] + extra) if len(starts) else 0
            rows = batch.lengths + extra
            out._base[extra] = append_rows(starts, total + np.cumsum(rows) - rows)
        return out

    def _init_process(self) -> None:
        self._pid = os.getpid()
        self.pool = BufferPool()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["pool"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process()

    def nrows(self, f: FieldSpec) -> np.ndarray:
        """Rows per episode of ``f`` (see :func:`~episodelake.episode.rows_for`)."""
        return rows_for(f, self.lengths)

    def gather(self, f: FieldSpec, pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``out[b, w] = row rows[b, w] of episode pos[b]``; zeros for rows outside the episode."""
        valid = (rows >= 0) & (rows < (self.lengths[pos] + extra_rows(f))[:, None])
        return self._gather(f, pos, rows, None if valid.all() else valid, {})

    def _gather(
        self,
        f: FieldSpec,
        pos: np.ndarray,
        rows: np.ndarray,
        valid: np.ndarray | None,
        sources: dict[int, np.ndarray],
        buffers: Buffers | None = None,
    ) -> np.ndarray:
        """:meth:`gather` given ``valid`` (the rows inside their episodes, None when all of them are).

        ``sources`` caches the table row numbers by extra rows, for the other fields of the same batch;
        ``buffers`` hands out the large output buffers (default: this reader's :class:`BufferPool`).
        """
        if os.getpid() != self._pid:  # forked: locks may have been held by a parent thread
            self._init_process()
        B, W = rows.shape
        shape = (B, W, *f.shape)
        # small buffers: a fresh array costs less than the pool's bookkeeping, and alignment does not matter
        small = B * W * math.prod(f.shape) * f.np_dtype.itemsize < SMALL_BYTES
        out = np.empty(shape, f.np_dtype) if small else (buffers or self.pool).take(shape, f.np_dtype)
        flat = out.reshape(B * W, *f.shape)
        values = self._table.get(f.key)
        if values is not None:
            extra = extra_rows(f)
            src = sources.get(extra)
            if src is None:
                src = self._base[extra][pos][:, None] + rows
                src = sources[extra] = (src if valid is None else np.where(valid, src, 0)).ravel()
            if len(values):
                np.take(values, src, axis=0, out=flat, mode="clip")
        else:
            inside = np.ones(rows.shape, dtype=bool) if valid is None else valid
            self._gather_tensor(self._tensor[f.key], pos, rows, inside, flat)
        if valid is not None:
            out[~valid] = 0
        return out

    def _gather_tensor(
        self, tf: TensorField, pos: np.ndarray, rows: np.ndarray, valid: np.ndarray, flat: np.ndarray
    ) -> None:
        if self.snap.verify:
            for p in np.unique(pos[~tf.verified[pos]]).tolist():
                self.snap.read_ranges(tf.field, [p], [0], [0])  # checks the episode's CRC-32 once
                tf.verified[p] = True
        W = rows.shape[1]
        dst = np.flatnonzero(valid.ravel())
        if not len(dst):
            return
        src = (tf.rows[pos][:, None] + rows).ravel()
        every = len(dst) == len(flat)  # no padding
        if not every:
            src = src[dst]
        item = dst // W
        if len(tf.arrays) == 1:
            used, which = np.zeros(1, np.int64), np.zeros(len(dst), np.int64)
        else:
            used, which = np.unique(tf.array_of[pos][item], return_inverse=True)
        array = used[which]
        sources = tf.sources(used, self.nrows(tf.field))
        readers = [sources[a] for a in used.tolist()]
        episodes = self.episode_ids[pos]
        if len(readers) == 1 and isinstance(readers[0], ChunkFiles):
            full = src
            if not every:  # padding slots copy a row the batch reads anyway (zeroed by _gather): one take
                full = np.full(len(flat), src[0])
                full[dst] = src
            if readers[0].gather(flat, full, None, episodes, W):
                return
        elif len(readers) > 1:
            copied = np.array(
                [
                    isinstance(r, ChunkFiles) and r.gather(flat, src[which == k], dst[which == k], episodes, W)
                    for k, r in enumerate(readers)
                ]
            )
            rest = ~copied[which]
            dst, src, item, array, which = dst[rest], src[rest], item[rest], array[rest], which[rest]
            if not len(dst):
                return
        # runs must stay inside one chunk (a shard of one-frame chunks) for readers that copy chunk by chunk;
        # TensorStore splits runs itself
        split = [
            0 if isinstance(r, TensorArray) else r.run_rows if isinstance(r, PlainArray) else r.chunk_rows
            for r in readers
        ]
        chunk_rows = np.array(split, dtype=np.int64)[which]
        chunk = np.where(chunk_rows > 0, src // np.maximum(chunk_rows, 1), 0)
        brk = (np.diff(dst) != 1) | (np.diff(src) != 1) | (np.diff(array) != 0) | (np.diff(chunk) != 0)
        starts = np.concatenate([[0], np.flatnonzero(brk) + 1])
        counts = np.diff(np.append(starts, len(dst)))
        eids = self.episode_ids[pos][item[starts]]
        by_array: dict[int, list[tuple[int, int, int, int]]] = {}
        for a, d, s, n, e in zip(
            array[starts].tolist(),
            dst[starts].tolist(),
            src[starts].tolist(),
            counts.tolist(),
            eids.tolist(),
            strict=True,
        ):
            by_array.setdefault(a, []).append((d, s, n, e))
        planned = []
        for a, runs in by_array.items():
            source = sources[a]
            if isinstance(source, PlainArray):
                planned.append((source, runs))
            else:
                source.copy_runs(flat, runs)
        copy_runs_many(planned, flat)  # every planned array's reads of the batch in flight together

    def pooled(self, count: int, length: int) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The ``(shape, dtype)`` of each buffer :meth:`segments` takes from its ``buffers`` for ``count`` items.

        In the order :meth:`segments` takes them; smaller fields are fresh arrays.
        """
        out = []
        for f in self.schema.step_fields:
            shape = (count, rows_for(f, length), *f.shape)
            if math.prod(shape) * f.np_dtype.itemsize >= SMALL_BYTES:
                out.append((shape, f.np_dtype))
        return out

    def segments(self, pos: np.ndarray, first: np.ndarray, length: int, buffers: Buffers | None = None) -> Segment:
        """A batch (``time_axis=1``) of ``length`` transitions from ``first`` of episodes ``pos``.

        ``first`` may be negative or run past the episode end: those slots are
        padding (zeros, ``mask`` False). Observation fields hold ``length + 1``
        rows (``obs``/``next_obs`` are views of them). ``buffers`` hands out
        the large field buffers (those :meth:`pooled` lists, in its order),
        default this reader's :class:`BufferPool`.
        """
        pos = np.asarray(pos, dtype=np.int64)
        first = np.asarray(first, dtype=np.int64)
        rows = first[:, None] + np.arange(length + 1)
        step_rows = rows[:, :length]
        lengths = self.lengths[pos]
        T = lengths[:, None]
        # Validity and table row numbers are shared by every field with the same extra rows: computed once per
        # batch, not per field, and validity not at all when every window lies inside its episode (no padding).
        inside: dict[int, np.ndarray | None] = {0: None, 1: None}
        if not len(pos) or (first.min() >= 0 and (first + length <= lengths).all()):
            mask = np.ones((len(pos), length), dtype=bool)
        else:
            for extra in (0, 1):
                ok = (rows[:, : length + extra] >= 0) & (rows[:, : length + extra] < T + extra)
                inside[extra] = None if ok.all() else ok
            mask = (step_rows >= 0) & (step_rows < T)  # the transitions inside their episodes
        sources: dict[int, np.ndarray] = {}
        data = {
            f.key: self._gather(f, pos, rows[:, : rows_for(f, length)], inside[extra_rows(f)], sources, buffers)
            for f in self.schema.step_fields
        }
        last = step_rows == T - 1
        terminated, truncated = last & self.terminated[pos][:, None], last & self.truncated[pos][:, None]
        return Segment(
            self.schema,
            data,
            terminated,
            truncated,
            mask,
            {name: col[pos] for name, col in self.meta.items()},
            episode_id=self.episode_ids[pos],
            start=first,
            time_axis=1,
            meta_mask={name: valid[pos] for name, valid in self.meta_valid.items()},
        )


_READER_LOCK = threading.Lock()


def _reset_lock_after_fork() -> None:
    global _READER_LOCK
    _READER_LOCK = threading.Lock()  # a parent's prefetch thread may have held it at fork time
    resident.reset_after_fork()


lifecycle.after_fork("batching", _reset_lock_after_fork)


def serve_loader_worker() -> None:
    """Set this process up as a ``DataLoader`` worker: no resident copy of its own, one copy thread.

    Every worker making its own resident copy of the arrays would hold the
    dataset once per worker: instead a worker reads raw local arrays through
    memory-mapped chunk files, so all workers share the kernel's page cache
    (copies a forked worker inherited from its parent are shared memory and
    still used). Batches are copied by the worker's own thread: the loader's
    parallelism is its worker processes, and pool threads in each would only
    compete with them for the cores.
    """
    global COPY_THREADS
    COPY_THREADS = 1
    resident.budget = 0


def reader_for(snap: Snapshot) -> WindowReader:
    """The snapshot's :class:`WindowReader`, built on first use and kept in ``snap.window_reader``."""
    with _READER_LOCK:
        if snap.window_reader is None:
            snap.window_reader = WindowReader(snap)
        return snap.window_reader
