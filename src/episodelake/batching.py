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
  cache. Everything else (compressed chunks, object stores) goes through
  TensorStore, every run of the batch issued at once in one ``ts.Batch`` so
  reads of the same chunk or shard are coalesced.
* Output buffers come from a :class:`BufferPool` and are reused once nothing
  references them any more: a batch the caller still holds is never
  overwritten, and a dropped one is recycled instead of re-faulting fresh
  pages every batch (a fresh ~26 MB array per batch costs ~3x).

A :class:`WindowReader` is picklable (worker processes get the loaded NumPy
state and reopen files lazily) and safe to use in forked workers when every
tensor field takes the memory-mapped path: TensorStore aborts a process that
uses it after ``fork()``, so a forked worker that would need it raises a
clear error instead (use a ``spawn`` multiprocessing context).
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import threading
from typing import Any

import numpy as np
import tensorstore as ts

from .errors import CorruptionError
from .schema import FieldSpec
from .segments import Segment
from .snapshot import Snapshot
from .tensors import TensorArray, array_parts

MAX_MAPPED_CHUNKS = 8192  # bound on cached chunk mappings per array (vm.max_map_count is ~65k)


PAGE = mmap.PAGESIZE
FORK_MESSAGE = (
    "field {key!r} ({where}) is read through TensorStore, which cannot run in a process forked from one "
    "that used it; use DataLoader(..., multiprocessing_context='spawn')"
)


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
        self.rows = rows
        self.chunk_rows = chunk_rows
        self.field = field
        self.row_shape = field.shape
        self._suffix = ("0",) * len(field.shape)
        self._maps: dict[int, tuple[mmap.mmap, np.ndarray]] = {}

    @classmethod
    def probe(cls, directory: str, field: FieldSpec) -> ChunkFiles | None:
        """A reader for the array at ``directory`` if its layout allows zero-copy reads, else None."""
        try:
            with open(os.path.join(directory, "zarr.json")) as fh:
                meta = json.load(fh)
            codecs = meta["codecs"]
            grid = meta["chunk_grid"]
            keys = meta["chunk_key_encoding"]
            chunk = list(grid["configuration"]["chunk_shape"])
            rows = int(meta["shape"][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None  # the TensorStore path reports unreadable metadata properly
        dt = field.np_dtype
        endian = (codecs[0].get("configuration") or {}).get("endian", "little") if codecs else None
        plain = (
            len(codecs) == 1
            and codecs[0].get("name") == "bytes"
            and (dt.itemsize == 1 or endian == sys.byteorder)
            and grid.get("name") == "regular"
            and chunk[1:] == list(field.shape)
            and keys.get("name") == "default"
            and (keys.get("configuration") or {}).get("separator", "/") == "/"
            and meta.get("data_type") == dt.name
            and meta.get("fill_value") in (0, False)
        )
        return cls(directory, rows, int(chunk[0]), field) if plain else None

    def chunk(self, c: int, episode_id: int) -> tuple[mmap.mmap, np.ndarray]:
        """Chunk ``c``'s mapping and its rows as a read-only array over it."""
        try:
            return self._maps[c]
        except KeyError:
            pass
        path = os.path.join(self.directory, "c", str(c), *self._suffix)
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
        if len(self._maps) >= MAX_MAPPED_CHUNKS:
            self._maps.clear()  # dropped mappings unmap once no batch copy is in flight
        self._maps[c] = entry
        return entry

    def copy_runs(self, out: np.ndarray, runs: list[tuple[int, int, int, int]]) -> None:
        """Copy runs ``(dst row, src row, count, episode id)`` (each inside one chunk) into ``out``.

        All runs' byte ranges are announced with ``MADV_WILLNEED`` before the
        first copy, so rows not in the page cache are read concurrently (and
        only those bytes) instead of one page fault at a time.
        """
        R, row = self.chunk_rows, self.field.step_bytes
        todo = []
        for dst, src, n, eid in runs:
            c, r = divmod(src, R)
            entry = self.chunk(c, eid)
            lo = r * row - r * row % PAGE
            entry[0].madvise(mmap.MADV_WILLNEED, lo, (r + n) * row - lo)
            todo.append((dst, entry[1], r, n))
        for dst, block, r, n in todo:
            out[dst : dst + n] = block[r : r + n]


class TensorStoreRows:
    """Reads through TensorStore: compressed chunks, sharded arrays, object stores."""

    def __init__(self, array: TensorArray) -> None:
        self.array = array
        self.rows = array.rows
        self.chunk_rows = 0  # TensorStore splits runs at chunk boundaries itself
        self._pid = os.getpid()

    def copy_runs(self, out: np.ndarray, runs: list[tuple[int, int, int, int]]) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(FORK_MESSAGE.format(key=self.array.field.key, where=self.array.where))
        batch = ts.Batch()
        futures = [self.array.store[src : src + n].read(batch=batch) for _, src, n, _ in runs]
        batch.submit()
        for (dst, src, n, eid), fut in zip(runs, futures, strict=True):
            try:
                out[dst : dst + n] = fut.result()
            except ValueError as exc:
                raise CorruptionError(
                    f"episode {eid}: field {self.array.field.key!r} rows [{src}, {src + n}) of "
                    f"{self.array.where} unreadable: {exc}"
                ) from exc


class TensorField:
    """One tensor field of a snapshot: per-episode writer and first row, one reader per writer."""

    def __init__(self, snap: Snapshot, field: FieldSpec) -> None:
        self.field = field
        self.writers, self.writer_of = np.unique(snap.index["writer"].astype(str), return_inverse=True)
        self.writer_of = self.writer_of.astype(np.int64)
        self.refs = snap.index[f"ref/{field.key}"].astype(np.int64)
        self.verified = np.zeros(len(self.refs), dtype=bool)  # CRC-checked episodes (Dataset.open(verify=True))
        self._snap = snap
        self._sources: list[ChunkFiles | TensorStoreRows] | None = None

    def sources(self, nrows: np.ndarray, forked: bool) -> list[ChunkFiles | TensorStoreRows]:
        """One reader per writer; ``forked``: this process was forked from the one that built the reader."""
        if self._sources is None:
            snap, f = self._snap, self.field
            out: list[ChunkFiles | TensorStoreRows] = []
            for w, writer in enumerate(self.writers.tolist()):
                src = ChunkFiles.probe(snap.loc.child(*array_parts(writer, f)), f) if snap.loc.is_local else None
                if src is None:
                    if forked:
                        raise RuntimeError(
                            FORK_MESSAGE.format(key=f.key, where=snap.loc.child(*array_parts(writer, f)))
                        )
                    try:
                        src = TensorStoreRows(snap.tensor_array(writer, f))
                    except CorruptionError as exc:
                        eid = int(snap.index["episode_id"][np.flatnonzero(self.writer_of == w)[0]])
                        raise CorruptionError(f"episode {eid}: field {f.key!r}: {exc}") from exc
                ends = self.refs + nrows
                over = (self.writer_of == w) & (ends > src.rows)
                if over.any():
                    p = int(np.flatnonzero(over)[0])
                    raise CorruptionError(
                        f"episode {int(snap.index['episode_id'][p])}: field {f.key!r} references rows "
                        f"[{self.refs[p]}, {ends[p]}) but the array of writer {writer} has {src.rows} rows"
                    )
                out.append(src)
            self._sources = out
        return self._sources

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sources": None}


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
        self.meta = {f.name: snap.index[f.key] for f in self.schema.meta_fields}
        self._table = {f.key: (snap.table_field(f), snap.offsets(f)[:-1]) for f in self.schema.table_step_fields}
        self._tensor = {f.key: TensorField(snap, f) for f in self.schema.tensor_fields}
        self._origin_pid = os.getpid()  # a different pid later means a forked worker
        self._init_process()

    def _init_process(self) -> None:
        self._pid = os.getpid()
        self.pool = BufferPool()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["pool"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._origin_pid = os.getpid()  # a fresh (spawned) process may start TensorStore
        self._init_process()

    def nrows(self, f: FieldSpec) -> np.ndarray:
        """Rows per episode of ``f``: ``T + 1`` for observations, ``T`` otherwise."""
        return self.lengths + 1 if f.role == "observation" else self.lengths

    def gather(self, f: FieldSpec, pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``out[b, w] = row rows[b, w] of episode pos[b]``; zeros for rows outside the episode."""
        if os.getpid() != self._pid:  # forked: locks may have been held by a parent thread
            self._init_process()
        B, W = rows.shape
        valid = (rows >= 0) & (rows < self.nrows(f)[pos][:, None])
        out = self.pool.take((B, W, *f.shape), f.np_dtype)
        flat = out.reshape(B * W, *f.shape)
        if f.key in self._table:
            values, base = self._table[f.key]
            src = np.where(valid, base[pos][:, None] + rows, 0).ravel()
            if len(values):
                np.take(values, src, axis=0, out=flat, mode="clip")
        else:
            self._gather_tensor(self._tensor[f.key], pos, rows, valid, flat)
        if not valid.all():
            out[~valid] = 0
        return out

    def _gather_tensor(
        self, tf: TensorField, pos: np.ndarray, rows: np.ndarray, valid: np.ndarray, flat: np.ndarray
    ) -> None:
        sources = tf.sources(self.nrows(tf.field), forked=os.getpid() != self._origin_pid)
        if self.snap.verify:
            for p in np.unique(pos[~tf.verified[pos]]).tolist():
                self.snap.read_ranges(tf.field, [p], [0], [0])  # checks the episode's CRC-32 once
                tf.verified[p] = True
        W = rows.shape[1]
        dst = np.flatnonzero(valid.ravel())
        if not len(dst):
            return
        src = (tf.refs[pos][:, None] + rows).ravel()[dst]
        item = dst // W
        writer = tf.writer_of[pos][item]
        chunk_rows = np.array([s.chunk_rows for s in sources], dtype=np.int64)[writer]
        chunk = np.where(chunk_rows > 0, src // np.maximum(chunk_rows, 1), 0)
        brk = (np.diff(dst) != 1) | (np.diff(src) != 1) | (np.diff(writer) != 0) | (np.diff(chunk) != 0)
        starts = np.concatenate([[0], np.flatnonzero(brk) + 1])
        counts = np.diff(np.append(starts, len(dst)))
        eids = self.episode_ids[pos][item[starts]]
        by_writer: dict[int, list[tuple[int, int, int, int]]] = {}
        for w, d, s, n, e in zip(
            writer[starts].tolist(),
            dst[starts].tolist(),
            src[starts].tolist(),
            counts.tolist(),
            eids.tolist(),
            strict=True,
        ):
            by_writer.setdefault(w, []).append((d, s, n, e))
        for w, runs in by_writer.items():
            sources[w].copy_runs(flat, runs)

    def segments(self, pos: np.ndarray, first: np.ndarray, length: int) -> Segment:
        """A batch (``time_axis=1``) of ``length`` transitions from ``first`` of episodes ``pos``.

        ``first`` may be negative or run past the episode end: those slots are
        padding (zeros, ``mask`` False). Observation fields hold ``length + 1``
        rows (``obs``/``next_obs`` are views of them).
        """
        pos = np.asarray(pos, dtype=np.int64)
        first = np.asarray(first, dtype=np.int64)
        obs_rows = first[:, None] + np.arange(length + 1)
        step_rows = obs_rows[:, :length]
        data = {
            f.key: self.gather(f, pos, obs_rows if f.role == "observation" else step_rows)
            for f in self.schema.step_fields
        }
        terminated, truncated, mask = self.flags(pos, step_rows)
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
        )

    def flags(self, pos: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``terminated``, ``truncated`` and ``mask`` for transition indices ``steps`` ``[B, W]``."""
        T = self.lengths[pos][:, None]
        last = steps == T - 1
        mask = (steps >= 0) & (steps < T)
        return last & self.terminated[pos][:, None], last & self.truncated[pos][:, None], mask
