"""Batched reads: row windows of many episodes gathered into reusable buffers.

One primitive serves segments, padded segments, frame stacks and action
chunks: for ``B`` episodes and a ``[B, W]`` matrix of episode-relative row
numbers, fill ``out[B, W, *shape]`` with the field's rows, and zeros where a
row number falls outside the episode (padding).

* Small per-step fields are one vectorized ``np.take`` from the snapshot's
  contiguous in-memory arrays.
* Tensor fields are split into runs of consecutive rows inside one chunk.
  Local arrays with the raw ``bytes`` codec (no compression, no sharding) are
  read zero-copy from memory-mapped chunk files, one ``memcpy`` per run: no
  per-read TensorStore overhead, and the kernel page cache is the chunk
  cache. A warm batch makes no system call (rows are announced to the kernel
  once per process), and large batches are copied by several threads.
  Everything else (compressed chunks, object stores) goes through
  TensorStore, every run of the batch issued at once in one ``ts.Batch`` so
  reads of the same chunk or shard are coalesced.
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
import math
import mmap
import os
import sys
import threading
from typing import Any

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


class ChunkFiles:
    """Zero-copy reads of a local Zarr v3 array stored with the raw ``bytes`` codec.

    Chunk ``c`` is the file ``c/<c>/0/...`` holding ``chunk_rows`` rows in C
    order; a missing file is a chunk TensorStore did not store because it
    equals the fill value (zeros).
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

    def chunk(self, c: int, episode_id: int) -> tuple[mmap.mmap, np.ndarray]:
        """Chunk ``c``'s mapping and its rows as a read-only array over it."""
        try:
            return self._maps[c]
        except KeyError:
            pass
        path = os.path.join(self.directory, *chunk_parts(c, len(self.row_shape)))
        want = self.chunk_rows * self.field.step_bytes
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size != want:
                    raise CorruptionError(
                        f"episode {episode_id}: field {self.field.key!r}: chunk file {path} holds {size} bytes, "
                        f"expected {want}"
                    )
                mm = mmap.mmap(fh.fileno(), want, prot=mmap.PROT_READ)
            entry = (mm, np.frombuffer(mm, self.field.np_dtype).reshape(self.chunk_rows, *self.row_shape))
        except FileNotFoundError as exc:
            # every chunk of referenced rows is stored (even all-zero ones): a missing file is damage
            raise CorruptionError(
                f"episode {episode_id}: field {self.field.key!r}: chunk file {path} is missing"
            ) from exc
        except OSError as exc:  # permission denied, I/O error: the storage failed (CorruptionError passes)
            err = storage_fault(exc, dataset=self.dataset, object=path, doing=f"reading episode {episode_id}")
            if err is None:
                raise
            raise err from exc
        if len(self._maps) >= MAX_MAPPED_CHUNKS:
            self._maps.clear()  # dropped mappings unmap once no batch copy is in flight
        self._maps[c] = entry
        return entry

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
        self, f: FieldSpec, pos: np.ndarray, rows: np.ndarray, valid: np.ndarray | None, sources: dict[int, np.ndarray]
    ) -> np.ndarray:
        """:meth:`gather` given ``valid`` (the rows inside their episodes, None when all of them are).

        ``sources`` caches the table row numbers by extra rows, for the other fields of the same batch.
        """
        if os.getpid() != self._pid:  # forked: locks may have been held by a parent thread
            self._init_process()
        B, W = rows.shape
        shape = (B, W, *f.shape)
        # small buffers: a fresh array costs less than the pool's bookkeeping, and alignment does not matter
        small = B * W * math.prod(f.shape) * f.np_dtype.itemsize < SMALL_BYTES
        out = np.empty(shape, f.np_dtype) if small else self.pool.take(shape, f.np_dtype)
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
        src = (tf.rows[pos][:, None] + rows).ravel()[dst]
        item = dst // W
        array = tf.array_of[pos][item]
        used, which = np.unique(array, return_inverse=True)
        sources = tf.sources(used, self.nrows(tf.field))
        # runs must stay inside one chunk (a shard of one-frame chunks) for readers that copy chunk by chunk;
        # TensorStore splits runs itself
        readers = [sources[a] for a in used.tolist()]
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

    def segments(self, pos: np.ndarray, first: np.ndarray, length: int) -> Segment:
        """A batch (``time_axis=1``) of ``length`` transitions from ``first`` of episodes ``pos``.

        ``first`` may be negative or run past the episode end: those slots are
        padding (zeros, ``mask`` False). Observation fields hold ``length + 1``
        rows (``obs``/``next_obs`` are views of them).
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
            f.key: self._gather(f, pos, rows[:, : rows_for(f, length)], inside[extra_rows(f)], sources)
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


lifecycle.after_fork("batching", _reset_lock_after_fork)


def reader_for(snap: Snapshot) -> WindowReader:
    """The snapshot's :class:`WindowReader`, built on first use and kept in ``snap.window_reader``."""
    with _READER_LOCK:
        if snap.window_reader is None:
            snap.window_reader = WindowReader(snap)
        return snap.window_reader
