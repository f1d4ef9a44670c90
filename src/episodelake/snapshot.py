"""One pinned version of a dataset, loaded lazily into NumPy for fast reads.

A :class:`Snapshot` orders episodes by ``(created_at, episode_id)`` (stable
across versions: appends only add rows at the end of that order) and exposes:

* the episode index (ids, lengths, flags, meta, tensor refs) as NumPy arrays;
* each small per-step field as one contiguous NumPy array of all episodes'
  rows plus row offsets (loaded on first use, from Arrow list values);
* TensorStore handles for each tensor field of each writer.

Readers of a snapshot see exactly the episodes of its version.
"""

from __future__ import annotations

import atexit
import gc
import os
import threading
import weakref
import zlib
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorstore as ts

from . import layout
from .episode import extra_rows, rows_for
from .errors import CorruptionError
from .schema import FieldSpec, from_storage, storage_dtype
from .store import Store
from .table import EpisodeTable
from .tensors import PlainArray, TensorArray, engine_usable, make_context, read_many, split_ref

INDEX_COLUMNS = ("episode_id", "writer", "length", "terminated", "truncated", "return", "created_at")


def flatten_lists(col: pa.ChunkedArray | pa.Array, depth: int) -> np.ndarray:
    """Values of a ``depth``-deep list column as one NumPy array (no copy when possible)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    for _ in range(depth):
        arr = pc.list_flatten(arr)
    return arr.to_numpy(zero_copy_only=False)


def decode_meta(col: pa.ChunkedArray, f: FieldSpec) -> np.ndarray:
    """A meta column as NumPy in episode order: the schema dtype, or objects for str/unset values.

    Vectorized (no per-row Python) so opening a million-episode snapshot stays fast.
    """
    if f.np_dtype.kind == "U":
        return col.to_numpy(zero_copy_only=False).astype(object)
    if col.null_count:
        return np.array(
            [
                None if v is None else from_storage(np.asarray(v, storage_dtype(f.np_dtype)), f.np_dtype)
                for v in col.to_pylist()
            ],
            dtype=object,
        )
    depth = len(f.shape) + (1 if f.np_dtype.kind == "c" else 0)
    values = flatten_lists(col, depth) if depth else col.to_numpy(zero_copy_only=False)
    inner = f.shape + ((2,) if f.np_dtype.kind == "c" else ())
    return from_storage(values.reshape(len(col), *inner), f.np_dtype)


class LazyIndex(Mapping[str, np.ndarray]):
    """The snapshot's index columns, each read from the table on first access.

    ``where()`` on a million episodes needs only ids and order; sampling loads
    the columns it uses. Picklable: loaded columns travel to worker processes.
    """

    def __init__(self, snap: Snapshot, names: list[str]) -> None:
        self._snap = snap
        self._names = names
        self._cols: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        with self._lock:
            if name not in self._cols:
                self._cols[name] = self._snap.load_index_column(name)
            return self._cols[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __getstate__(self) -> dict[str, Any]:
        return {"_snap": self._snap, "_names": self._names, "_cols": self._cols}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


_LIVE: weakref.WeakSet[Snapshot] = weakref.WeakSet()


@atexit.register
def _release_arrow_at_exit() -> None:
    """Drop every snapshot's Arrow dataset and collect, while Arrow and the interpreter are fully alive.

    Left to the interpreter's final teardown, Arrow's scan machinery can be
    destroyed after its thread pools, and the process aborts ("terminate
    called without an active exception"). A snapshot used later reopens its
    dataset on demand.
    """
    for snap in list(_LIVE):
        snap._dataset = None
    gc.collect()


class Snapshot:
    """Episodes of one table version, in stable order. Thread-safe lazy loading.

    Unreadable table files and tensor chunks raise :class:`CorruptionError`
    naming the file (and the episode, for tensors). With ``verify`` set, each
    episode's tensor rows are checked against their stored CRC-32 on its first
    read from this snapshot (a whole-episode read, then cached as verified).
    """

    verify = False

    def __init__(self, store: Store) -> None:
        """The store's table at its pinned version; tensors are read through the store's TensorStore context."""
        self.loc = store.location
        self.schema = store.schema
        self.version = store.version
        self._dataset = store.table.dataset()
        self._context: ts.Context | None = store.context
        self._lock = threading.Lock()
        self._fields: dict[str, np.ndarray] = {}
        self._arrays: dict[tuple[str, int, str], TensorArray | PlainArray] = {}
        self._arrays_pid = os.getpid()
        self._verified: set[tuple[str, int]] = set()
        self.window_reader: Any = None  # the batch reader, built once by batching.reader_for (pickled along)
        _LIVE.add(self)

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes get the loaded NumPy caches; the Arrow dataset, the
        # TensorStore context/handles and the lock are per process.
        state = self.__dict__.copy()
        for name in ("_dataset", "_context", "_lock", "_arrays"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._dataset = None
        self._context = None  # made on first tensor read (a forked process reads without TensorStore)
        self._lock = threading.Lock()
        _LIVE.add(self)
        self._arrays = {}
        self._arrays_pid = os.getpid()

    def _read_table(self, columns: list[str]) -> pa.Table:
        try:
            return self.arrow_dataset().to_table(columns=columns)
        except (OSError, pa.ArrowException) as exc:
            where = f"{self.loc.url} version {self.version}: episode table unreadable"
            for fragment in self.arrow_dataset().get_fragments():  # Arrow does not always name the damaged file
                try:
                    fragment.to_table(columns=[c for c in columns if c in fragment.physical_schema.names])
                except (OSError, pa.ArrowException):
                    where += f" at {self.loc.child(*layout.table_parts(fragment.path))}"
                    break
            raise CorruptionError(f"{where}: {exc}") from exc

    def arrow_dataset(self):
        if self._dataset is None:  # unpickled in another process: reopen the pinned version
            self._dataset = EpisodeTable.open(self.loc, self.version).dataset()
        return self._dataset

    @cached_property
    def _order(self) -> tuple[np.ndarray, np.ndarray]:
        """(episode ids in table-scan order, the permutation that puts rows in episode order)."""
        tbl = self._read_table(["episode_id", "created_at"])
        ids = tbl.column("episode_id").to_numpy()
        created = tbl.column("created_at").combine_chunks().cast(pa.int64()).to_numpy()
        return ids, np.lexsort((ids, created))

    @cached_property
    def index(self) -> Mapping[str, np.ndarray]:
        """Index columns (+ meta and tensor refs) as NumPy in episode order, each loaded on first use."""
        cols = list(INDEX_COLUMNS)
        cols += [f.key for f in self.schema.meta_fields]
        for f in self.schema.tensor_fields:
            cols += [f"ref/{f.key}", f"crc/{f.key}"]
        return LazyIndex(self, cols)

    def load_index_column(self, name: str) -> np.ndarray:
        """One index column in episode order (meta columns decoded to the schema dtype)."""
        scan_ids, order = self._order
        if name == "episode_id":
            return scan_ids[order]
        tbl = self._read_table(["episode_id", name])
        col = tbl.column(name).combine_chunks()
        ids = tbl.column("episode_id").to_numpy()
        # scans are deterministic, so rows normally come in the order of the first read
        rows = order if np.array_equal(ids, scan_ids) else np.argsort(self.positions_of(ids), kind="stable")
        col = col.take(pa.array(rows))
        meta = {f.key: f for f in self.schema.meta_fields}
        return decode_meta(col, meta[name]) if name in meta else col.to_numpy(zero_copy_only=False)

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """Snapshot positions of episode ``ids`` (vectorized); unknown ids raise KeyError."""
        sorted_ids, pos = self._id_lookup
        ids = np.asarray(ids, dtype=np.int64)
        idx = np.searchsorted(sorted_ids, ids).clip(max=max(len(sorted_ids) - 1, 0))
        found = sorted_ids[idx] == ids if len(sorted_ids) else np.zeros(len(ids), dtype=bool)
        if not found.all():
            raise KeyError(f"episode ids not in snapshot version {self.version}: {ids[~found][:10].tolist()}")
        return pos[idx]

    @cached_property
    def _id_lookup(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(self.index["episode_id"], dtype=np.int64)
        pos = np.argsort(ids, kind="stable")
        return ids[pos], pos

    @cached_property
    def num_episodes(self) -> int:
        return len(self.index["episode_id"])

    @cached_property
    def lengths(self) -> np.ndarray:
        return self.index["length"].astype(np.int64)

    @cached_property
    def _row_offsets(self) -> dict[int, np.ndarray]:
        """By :func:`~episodelake.episode.extra_rows`: each episode's first row among all rows, then the total."""
        extras = {extra_rows(f) for f in self.schema.step_fields}
        return {e: np.concatenate([[0], np.cumsum(self.lengths + e)]).astype(np.int64) for e in extras}

    def offsets(self, f: FieldSpec) -> np.ndarray:
        """Start of each episode's rows of ``f`` in a concatenation of all episodes (the total last)."""
        return self._row_offsets[extra_rows(f)]

    def meta(self, pos: int) -> dict[str, Any]:
        """Per-episode meta values of episode ``pos`` in their schema dtype (None if unset)."""
        out: dict[str, Any] = {}
        for f in self.schema.meta_fields:
            v = self.index[f.key][pos]
            out[f.name] = v if v is None or isinstance(v, str) else np.asarray(v, f.np_dtype)[()]
        return out

    def table_field(self, f: FieldSpec) -> np.ndarray:
        """All rows of a small per-step field, episode after episode, schema dtype."""
        with self._lock:
            if f.key in self._fields:
                return self._fields[f.key]
            tbl = self._read_table(["episode_id", f.key])
            pos = self.positions_of(tbl.column("episode_id").to_numpy())
            col = tbl.column(f.key).combine_chunks().take(pa.array(np.argsort(pos)))
            listed = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            want = np.diff(self.offsets(f))
            if len(listed) != len(want) or (listed != want).any():
                bad = int(np.flatnonzero(listed != want)[0]) if len(listed) == len(want) else 0
                raise CorruptionError(
                    f"episode {int(self.index['episode_id'][bad])}: field {f.key!r} holds {listed[bad]} rows, "
                    f"its length implies {want[bad]}"
                )
            depth = 1 + len(f.shape) + (1 if f.np_dtype.kind == "c" else 0)
            values = flatten_lists(col, depth)
            rows = self.offsets(f)[-1]
            inner = f.shape + ((2,) if f.np_dtype.kind == "c" else ())
            if values.size != rows * int(np.prod(inner, dtype=np.int64)):
                raise CorruptionError(
                    f"field {f.key!r}: table holds {values.size} values, episode lengths imply {rows} rows"
                )
            arr = from_storage(values.reshape(rows, *inner), f.np_dtype)
            self._fields[f.key] = arr
            return arr

    def tensor_array(self, writer: str, f: FieldSpec, commit: int = 0) -> TensorArray | PlainArray:
        """The array holding ``writer``'s rows of ``f`` (``commit`` 0: its single array); see :meth:`tensor_arrays`."""
        return self.tensor_arrays(f, [(writer, commit)])[0]

    def tensor_arrays(self, f: FieldSpec, arrays: Sequence[tuple[str, int]]) -> list[TensorArray | PlainArray]:
        """The ``(writer, commit)`` arrays of ``f``, opened once per process (missing ones all at once).

        A process forked from one that used TensorStore reads through
        :class:`~episodelake.tensors.PlainArray` instead; handles opened
        before a fork are never used after it.
        """
        if self._arrays_pid != os.getpid():  # forked: a parent thread may have held the lock at fork time
            self._lock = threading.Lock()
            self._arrays, self._arrays_pid = {}, os.getpid()
        with self._lock:
            missing = list(dict.fromkeys(a for a in arrays if (*a, f.key) not in self._arrays))
            if not engine_usable():
                opened: list[TensorArray | PlainArray] = [PlainArray(self.loc, w, f, c) for w, c in missing]
            elif missing:
                if self._context is None:
                    self._context = make_context()
                opened = list(TensorArray.open_many(self.loc, missing, f, self._context))
            else:
                opened = []
            for (w, c), arr in zip(missing, opened, strict=True):
                self._arrays[(w, c, f.key)] = arr
            return [self._arrays[(w, c, f.key)] for w, c in arrays]

    def field_rows(self, f: FieldSpec, pos: int) -> tuple[int, int]:
        """(start, stop) of episode ``pos``'s rows of ``f`` in its storage (its tensor array, or the table)."""
        n = rows_for(f, int(self.lengths[pos]))
        if f.in_tensor:
            start = split_ref(self.index[f"ref/{f.key}"][pos])[1]
        else:
            start = int(self.offsets(f)[pos])
        return start, start + n

    def read_ranges(self, f: FieldSpec, pos: Sequence[int], lo: Sequence[int], hi: Sequence[int]) -> list[np.ndarray]:
        """Rows ``[lo, hi)`` (episode-relative) of field ``f`` for episodes ``pos``."""
        if not f.in_tensor:
            values = self.table_field(f)
            base = self.offsets(f)
            return [values[base[p] + a : base[p] + b] for p, a, b in zip(pos, lo, hi, strict=True)]
        requests = []
        for p, a, b in zip(pos, lo, hi, strict=True):
            eid = int(self.index["episode_id"][p])
            try:
                commit = split_ref(self.index[f"ref/{f.key}"][p])[0]
                arr = self.tensor_array(str(self.index["writer"][p]), f, commit)
            except CorruptionError as exc:
                raise CorruptionError(f"episode {eid}: field {f.key!r}: {exc}") from exc
            start, stop = self.field_rows(f, p)
            if stop > arr.rows:
                raise CorruptionError(
                    f"episode {eid}: field {f.key!r} references rows [{start}, {stop}) "
                    f"but {arr.where} has {arr.rows} rows"
                )
            if self.verify and (f.key, p) not in self._verified:
                self._verify_rows(f, p, arr, start, stop)
            requests.append((arr, start + a, start + b))
        try:
            return read_many(requests)
        except ValueError:  # TensorStore could not read a chunk: find the episode to name it
            for (arr, start, stop), p in zip(requests, pos, strict=True):
                try:
                    read_many([(arr, start, stop)])
                except ValueError as exc:
                    raise CorruptionError(
                        f"episode {int(self.index['episode_id'][p])}: field {f.key!r} rows [{start}, {stop}) "
                        f"of {arr.where} unreadable: {exc}"
                    ) from exc
            raise

    def _verify_rows(self, f: FieldSpec, p: int, arr: TensorArray | PlainArray, start: int, stop: int) -> None:
        where = f"episode {int(self.index['episode_id'][p])}: field {f.key!r} rows [{start}, {stop}) of {arr.where}"
        try:
            rows = read_many([(arr, start, stop)])[0]
        except ValueError as exc:
            raise CorruptionError(f"{where} unreadable: {exc}") from exc
        if zlib.crc32(np.ascontiguousarray(rows).data) != int(self.index[f"crc/{f.key}"][p]):
            raise CorruptionError(f"{where} fail their CRC-32 check")
        self._verified.add((f.key, p))
