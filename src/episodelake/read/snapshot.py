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

import errno
import gc
import os
import threading
import weakref
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import tensorstore as ts

from ..core import lifecycle
from ..core.episode import extra_rows, rows_for
from ..core.errors import CorruptionError, StorageError
from ..core.growable import append_rows
from ..core.schema import FieldSpec, from_storage, storage_dtype
from ..core.stats import STATS_PREFIX
from ..storage import layout, table_cache
from ..storage.arrays import ArrayReader, split_ref
from ..storage.engine import engine_usable
from ..storage.faults import clean_text, storage_fault
from ..storage.planned import PlainArray, read_many
from ..storage.rows import QUARANTINED
from ..storage.side_table import ID, DerivedState, side_values
from ..storage.store import Store
from ..storage.table import EpisodeTable
from ..storage.tensors import TensorArray, make_context

INDEX_COLUMNS = ("episode_id", "writer", "length", "terminated", "truncated", "return", "created_at")
FILE_COLUMN = "__fragment_index"  # Arrow's scan column: the index of the file a row was read from


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
    """The snapshot's index columns in episode order, each decoded from the one index scan on first access.

    Picklable: decoded columns travel to worker processes.
    """

    def __init__(self, snap: Snapshot, names: list[str]) -> None:
        self._snap = snap
        self._names = names
        self._cols: dict[str, np.ndarray] = {}
        # re-entrant: loading a derived column looks up episode positions through this index
        self._lock = threading.RLock()

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

    @property
    def loaded(self) -> dict[str, np.ndarray]:
        """The columns decoded so far."""
        with self._lock:
            return dict(self._cols)

    def __getstate__(self) -> dict[str, Any]:
        return {"_snap": self._snap, "_names": self._names, "_cols": self._cols}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


@dataclass(frozen=True)
class IndexScan:
    """The one read of a snapshot's index columns, in table-scan order.

    ``table``: the index columns (storage types); ``order``: the scan row of
    each snapshot position; ``file``: the table file (fragment) each scan row
    came from; ``fragments``: those files, in the order ``file`` indexes.
    """

    table: pa.Table
    order: np.ndarray
    file: np.ndarray
    fragments: list[pads.Fragment]
    kept: int = 0  # leading positions whose episodes (and order) are those of the scan this one extends
    # after files were removed (eviction, delete, compaction): each scan row's position in the scan this one
    # grew from when its file is still there (its episode unchanged), else -1 (read from a file added since)
    base_position: np.ndarray | None = None
    base_lengths: np.ndarray | None = None  # the lengths of that scan's episodes, in its position order

    def rows_of_files(self, files: np.ndarray) -> list[np.ndarray]:
        """The scan rows of each table file in ``files``, in the file's own row order."""
        by_file, starts = self._by_file
        if by_file is None:
            return [np.arange(starts[j], starts[j + 1]) for j in files]
        return [by_file[starts[j] : starts[j + 1]] for j in files]

    @cached_property
    def _by_file(self) -> tuple[np.ndarray | None, np.ndarray]:
        """The scan rows sorted by file (None: they are already) and where each file's rows start."""
        counts = np.bincount(self.file, minlength=len(self.fragments))
        # a scan reads its files in turn, so its rows are grouped by file unless it grew after a removal
        grouped = bool((self.file[1:] >= self.file[:-1]).all())
        return None if grouped else np.argsort(self.file, kind="stable"), np.concatenate([[0], np.cumsum(counts)])


@dataclass(frozen=True)
class ScanBase:
    """What a snapshot of a newer version keeps of an older one's: its index scan and decoded index columns."""

    url: str
    version: int
    scan: IndexScan
    columns: dict[str, np.ndarray]
    derived: tuple[DerivedState, pa.Table] | None = None  # its derived state and values, once read
    fields: dict[str, np.ndarray] | None = None  # its small per-step fields read so far (not derived ones)


_LIVE: weakref.WeakSet[Snapshot] = weakref.WeakSet()


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


lifecycle.on_exit("snapshots", _release_arrow_at_exit)


class Snapshot:
    """Episodes of one table version, in stable order. Thread-safe lazy loading.

    Unreadable table files and tensor chunks raise :class:`CorruptionError`
    naming the file (and the episode, for tensors). With ``verify`` set, each
    episode's tensor rows are checked against their stored CRC-32 on its first
    read from this snapshot (a whole-episode read, then cached as verified).

    Quarantined episodes (quality column ``quarantined`` true, ``write/gate.py``)
    are left out of everything a snapshot reads (its index, table reads and the
    SQL views over :meth:`arrow_dataset`); ``quarantined=True`` makes the
    snapshot of exactly those instead (``ds.quality.quarantine()``).
    """

    verify = False

    def __init__(self, store: Store, base: ScanBase | None = None, quarantined: bool = False) -> None:
        """The store's table at its pinned version; tensors are read through the store's TensorStore context.

        ``base`` (:meth:`successor_base` of a snapshot of an older version of
        the same table): when no table file was removed since (no compaction,
        delete or eviction), the index scan reads only the files added since
        and keeps the decoded columns, so a learner's refresh costs O(new
        episodes) of reading and decoding.
        """
        self.loc = store.location
        self.derived = DerivedState.of(store.table.dt)  # derived columns as of this version (derived.py)
        self.schema = store.schema.with_derived(self.derived.fields)
        self.checks = store.checks()  # the quality checks as of this version (core.quality)
        self.version = store.version
        self.quarantined = quarantined
        self._writes_cache = not store.read_only  # a read-only dataset maps table cache entries, writes none
        self._dataset = store.table.dataset()
        self._visible = _quarantine_filter(self._dataset.schema, quarantined)
        self._context: ts.Context | None = store.context
        self._lock = threading.Lock()
        self._fields: dict[str, np.ndarray] = {}
        self._derived_values: pa.Table | None = None
        self._arrays: dict[tuple[str, int, str], TensorArray | PlainArray] = {}
        self._arrays_pid = os.getpid()
        self._verified: set[tuple[str, int]] = set()
        self._scan: IndexScan | None = None
        self._scan_lock = threading.Lock()
        self._keys: tuple[np.ndarray, np.ndarray] | None = None  # order_keys() read before the index scan
        grows = base is not None and base.url == self.loc.url and base.version < self.version and not quarantined
        self._base = base.scan if grows and base is not None else None
        self._base_columns = dict(base.columns) if grows and base is not None else {}
        self._base_derived = base.derived if grows and base is not None else None
        self._base_fields = dict(base.fields or {}) if grows and base is not None else {}
        self._new_rows: dict[str, pa.Array] = {}  # grown fields' rows of the new episodes, read but not yet decoded
        self.window_reader: Any = None  # the batch reader, built once by batching.reader_for (pickled along)
        _LIVE.add(self)

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes get the loaded NumPy caches; the Arrow dataset and index
        # scan, the TensorStore context/handles and the locks are per process.
        state = self.__dict__.copy()
        for name in (
            "_dataset",
            "_context",
            "_lock",
            "_arrays",
            "_scan",
            "_scan_lock",
            "_base",
            "_base_columns",
            "_base_derived",
            "_base_fields",
        ):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._dataset = None
        self._context = None  # made on first tensor read (a forked process reads without TensorStore)
        self._lock = threading.Lock()
        self._scan, self._scan_lock = None, threading.Lock()
        self._base, self._base_columns, self._base_derived, self._base_fields = None, {}, None, {}
        _LIVE.add(self)
        self._arrays = {}
        self._arrays_pid = os.getpid()

    def _read_table(self, columns: list[str], dataset: pads.Dataset | None = None) -> pa.Table:
        """``columns`` of every row of the table (or of ``dataset``, some of its files); damage is CorruptionError."""
        try:
            return (dataset or self.arrow_dataset()).to_table(columns=columns, filter=self._visible)
        except (OSError, pa.ArrowException) as exc:
            raise self.unreadable(columns, exc) from exc

    def unreadable(self, columns: list[str] | None, exc: Exception) -> StorageError | CorruptionError:
        """The error for a failed read of the table's ``columns`` (None: all): a storage fault, else damage.

        Damage names the file: each file is read again until one fails.
        """
        doing = f"reading the episode table (version {self.version})"
        endpoint = self.loc.endpoint
        fault = storage_fault(exc, dataset=self.loc.url, doing=doing, endpoint=endpoint)
        if fault is None:  # object stores may word an unreachable endpoint as a missing file: ask the storage
            try:
                EpisodeTable.open(self.loc, self.version).stored_files()
            except Exception as probe:  # a diagnosis: whatever else it hits, the read's own error stands
                fault = storage_fault(probe, dataset=self.loc.url, doing=doing, endpoint=endpoint)
        if fault is not None:
            return fault
        # Damage is said only of a file that fails again: each file is read once more (Arrow does not always
        # name the damaged one); when every file reads, the failure was the storage's, not the data's.
        where = f"{self.loc.url} version {self.version}: episode table unreadable"
        damaged = None
        try:
            for fragment in self.arrow_dataset().get_fragments():
                try:
                    names = fragment.physical_schema.names
                    fragment.to_table(columns=None if columns is None else [c for c in columns if c in names])
                except (OSError, pa.ArrowException) as again:
                    fault = storage_fault(again, dataset=self.loc.url, doing=doing, endpoint=endpoint)
                    if fault is not None:
                        return fault
                    damaged = self.loc.child(*layout.table_parts(fragment.path))
                    break
        except Exception as listing:  # the file list itself: an outage, or damage the read already reported
            fault = storage_fault(listing, dataset=self.loc.url, doing=doing, endpoint=endpoint)
            if fault is not None:
                return fault
            return CorruptionError(f"{where}: {exc}")
        if damaged is None and not self.loc.is_local:
            return StorageError(
                f"{doing} failed at dataset {self.loc.url} (endpoint {endpoint}): every table file read again "
                f"without fault, so the storage failed, not the data; read again ({clean_text(str(exc))[:300]})",
                errno=errno.EIO,
                dataset=self.loc.url,
                object=self.loc.delta_uri(),
            )
        return CorruptionError(f"{where}{' at ' + damaged if damaged else ''}: {exc}")

    def arrow_dataset(self):
        """The table at this version as an Arrow dataset: every row (quarantined ones too)."""
        if self._dataset is None:  # unpickled in another process: reopen the pinned version
            self._dataset = EpisodeTable.open(self.loc, self.version).dataset()
        return self._dataset

    def visible_dataset(self) -> pads.Dataset:
        """The rows of the episodes this snapshot holds, as an Arrow dataset (what SQL views and copies read)."""
        whole = self.arrow_dataset()
        return whole if self._visible is None else whole.filter(self._visible)

    def successor_base(self) -> ScanBase | None:
        """What a snapshot of a newer version of this table can grow from (None before the index scan)."""
        scan = self._scan
        if scan is None:
            return None
        values = self._derived_values
        derived = None if values is None else (self.derived, values)
        derived_keys = {f.key for f in self.derived.fields}
        fields = {k: v for k, v in self._fields.items() if k not in derived_keys}
        return ScanBase(self.loc.url, self.version, scan, self.index.loaded, derived, fields)

    def index_columns(self) -> list[str]:
        """The columns of the one index scan: episode index, meta fields, tensor refs and checksums."""
        cols = list(INDEX_COLUMNS)
        cols += [f.key for f in self.schema.meta_fields if not f.derived]
        for f in self.schema.tensor_fields:
            cols += [f"ref/{f.key}", f"crc/{f.key}"]
        return cols

    def scan(self) -> IndexScan:
        """The index columns of every episode, read from the table in ONE scan on first need.

        Everything positional (order, ids, lengths, meta, refs, the in-memory
        ``where()``) derives from it; statistics and small per-step fields are
        read later, and only where used.
        """
        with self._scan_lock:
            if self._scan is None:
                fragments = list(self.arrow_dataset().get_fragments())
                base, self._base = self._base, None
                grown = self._grow(base, fragments) if base is not None else None
                if grown is None:
                    tbl, file = self._scan_files(fragments)
                    self._scan = IndexScan(tbl, _episode_order(tbl), file, fragments)
                else:
                    self._scan = grown
            return self._scan

    def scan_ready(self) -> bool:
        """Whether the index scan is made, or cheap to make (it grows from an older snapshot's)."""
        return self._scan is not None or self._base is not None

    def order_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Each position's episode-order key: ``(created_at`` in microseconds, ``episode_id)``, both int64, increasing.

        From the index scan when it is made; else from a read of those two
        columns only, so a first query that needs no other index column does
        not wait for the whole scan. Kept: the same keys either way.
        """
        with self._scan_lock:
            if self._keys is None:
                scan = self._scan
                if scan is not None:
                    self._keys = _order_keys(scan.table, scan.order)
                else:
                    self._keys = self._read_order_keys()
            return self._keys

    def _read_order_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`order_keys` from the two columns, sorted; through the table cache when local (mapped when this
        version's were read before, by any process)."""
        if not table_cache.enabled(self.loc):
            return _order_keys(self._read_table(["created_at", "episode_id"]))
        entry = table_cache.keys_entry(self.version, self.arrow_dataset().files, self.quarantined)
        table = table_cache.load(self.loc, entry)
        if table is None:
            created, ids = _order_keys(self._read_table(["created_at", "episode_id"]))
            if self._writes_cache:
                table_cache.store_later(self.loc, entry, pa.table({"created_at": created, "episode_id": ids}))
            return created, ids
        return table_cache.column(table, "created_at"), table_cache.column(table, "episode_id")

    def positions_of_keys(self, created: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Snapshot positions of the episodes with order keys ``(created, ids)`` (:meth:`order_keys`); unknown
        ones raise KeyError. A binary search by ``created_at``; ids break its ties (a bulk commit's episodes
        share one)."""
        keys_created, keys_ids = self.order_keys()
        if not len(keys_ids):
            if len(ids):
                raise KeyError(f"episode ids not in snapshot version {self.version}: {ids[:10].tolist()}")
            return np.zeros(0, np.int64)
        at = np.searchsorted(keys_created, created).clip(max=len(keys_ids) - 1)
        miss = keys_ids[at] != ids
        if miss.any():
            by_id = np.argsort(keys_ids, kind="stable")
            where = by_id[np.searchsorted(keys_ids, ids[miss], sorter=by_id).clip(max=len(by_id) - 1)]
            found = keys_ids[where] == ids[miss]
            if not found.all():
                missing = ids[miss][~found][:10].tolist()
                raise KeyError(f"episode ids not in snapshot version {self.version}: {missing}")
            at[miss] = where
        return at

    def _scan_files(
        self, fragments: list[pads.Fragment], files: np.ndarray | None = None
    ) -> tuple[pa.Table, np.ndarray]:
        """The index columns of table files ``files`` (of ``fragments``; None: all) and each row's file."""
        picked = None
        if files is not None:
            whole = self.arrow_dataset()
            picked = pads.FileSystemDataset([fragments[j] for j in files], whole.schema, whole.format, whole.filesystem)
        tbl = self._read_table([*self.index_columns(), FILE_COLUMN], picked)
        file = tbl.column(FILE_COLUMN).to_numpy().astype(np.int64)
        return tbl.drop_columns([FILE_COLUMN]), file if files is None else files[file]

    def _grow(self, base: IndexScan, fragments: list[pads.Fragment]) -> IndexScan | None:
        """``base`` (an older version's scan) less the rows of files removed since, plus the files added since.

        Table files are immutable, so rows of the files still there are the
        same episodes: only the files added since are read (an eviction's
        rewritten file among them). None when the columns changed.
        """
        where = {f.path: j for j, f in enumerate(fragments)}
        known = {f.path for f in base.fragments}
        new_files = np.array([j for j, f in enumerate(fragments) if f.path not in known], np.int64)
        added, file = self._scan_files(fragments, new_files)
        if not added.schema.equals(base.table.schema):
            return None
        old_file = np.array([where.get(f.path, -1) for f in base.fragments], dtype=np.int64)[base.file]
        n_old = base.table.num_rows
        if (old_file < 0).any():  # a delete, an eviction or a compaction removed files: episode order made again
            stay = np.flatnonzero(old_file >= 0)
            table = pa.concat_tables([base.table.take(pa.array(stay)), added])
            position = np.empty(n_old, np.int64)
            position[base.order] = np.arange(n_old)
            from_base = np.concatenate([position[stay], np.full(added.num_rows, -1, np.int64)])
            lengths = base.table.column("length").to_numpy()[base.order].astype(np.int64)
            file = np.concatenate([old_file[stay], file])
            return IndexScan(table, _episode_order(table), file, fragments, 0, from_base, lengths)
        table = pa.concat_tables([base.table, added])
        order = _episode_order(added) + n_old
        # appends by one writer come after every episode it had: positions stay, only new ones follow
        if n_old and len(order) and table_key(base.table, int(base.order[-1])) > table_key(table, int(order[0])):
            return IndexScan(table, _episode_order(table), np.concatenate([old_file, file]), fragments)
        return IndexScan(table, np.concatenate([base.order, order]), np.concatenate([old_file, file]), fragments, n_old)

    def read_files(self, columns: list[str], files: np.ndarray) -> Iterator[tuple[np.ndarray, pa.Table]]:
        """``columns`` of the episodes stored in table files ``files`` (indexes into :attr:`IndexScan.fragments`).

        One scan of those files only, streamed: ``(scan rows, their columns)``
        one record batch at a time (rows of one file, increasing), so the
        whole read is never held in memory. Local files are memory-mapped
        (:func:`_mapped`). Damage, or a file whose row count changed since the
        index scan, raises CorruptionError.
        """
        scan = self.scan()
        rows = np.concatenate([np.empty(0, np.int64), *scan.rows_of_files(files)])
        picked = _mapped(self.arrow_dataset(), [scan.fragments[j] for j in files])
        start = 0
        try:
            batches = picked.to_batches(columns=columns, filter=self._visible, memory_pool=_read_pool())
            for batch in batches:  # file order, each file's rows
                piece = rows[start : start + batch.num_rows]
                start += batch.num_rows
                if len(piece) == batch.num_rows:
                    yield piece, pa.Table.from_batches([batch])
        except (OSError, pa.ArrowException) as exc:
            raise self.unreadable(columns, exc) from exc
        if start != len(rows):
            raise CorruptionError(
                f"{self.loc.url} version {self.version}: table files hold {start} rows, the index scan read {len(rows)}"
            )

    def read_stats(self, columns: list[str], files: np.ndarray) -> Iterator[tuple[np.ndarray, pa.Table]]:
        """Like :meth:`read_files`, for statistics ``columns``: one table file at a time, through the statistics cache.

        A local file's statistics columns (every one, with its quarantine
        flags) are decoded on its first read and cached
        (:mod:`~episodelake.storage.table_cache`; not by a read-only
        dataset); later reads, in any process, map the entry. Remote
        datasets read as :meth:`read_files`.
        """
        if not table_cache.enabled(self.loc):
            yield from self.read_files(columns, files)
            return
        scan = self.scan()
        schema = self.arrow_dataset().schema
        for j, rows in zip(files, scan.rows_of_files(files), strict=True):
            fragment = scan.fragments[j]
            entry = table_cache.stats_entry(self.loc, fragment.path)
            table = None if entry is None else table_cache.load(self.loc, entry)
            kept = None if table is None else self._visible_rows(table, len(rows))
            if table is None or kept is None:  # no entry, or one disagreeing with the index scan: decode the file
                table = self._decode_stats(fragment, schema)
                if entry is not None and self._writes_cache:
                    table_cache.store_later(self.loc, entry, table)
                kept = self._visible_rows(table, len(rows))
            if kept is None:
                raise CorruptionError(
                    f"{self.loc.url} version {self.version}: table file {fragment.path} holds "
                    f"{table.num_rows} rows of which the index scan read {len(rows)}"
                )
            names = set(kept.column_names)  # a file written before a field was added has none of its columns
            out = [kept.column(c) if c in names else pa.nulls(kept.num_rows, schema.field(c).type) for c in columns]
            yield rows, pa.table(out, names=columns)

    def _decode_stats(self, fragment: pads.Fragment, schema: pa.Schema) -> pa.Table:
        """Every statistics column of table file ``fragment``, and whether each row is quarantined (NULL: not)."""
        names = [n for n in schema.names if n.startswith(STATS_PREFIX)]
        read = [*names, QUARANTINED] if QUARANTINED in schema.names else names
        try:
            table = _mapped(self.arrow_dataset(), [fragment]).to_table(columns=read, memory_pool=_read_pool())
        except (OSError, pa.ArrowException) as exc:
            raise self.unreadable(read, exc) from exc
        if QUARANTINED in read:
            flags = table.column(QUARANTINED).fill_null(False)
        else:
            flags = pa.chunked_array([np.zeros(len(table), dtype=bool)], pa.bool_())
        return table.select(names).append_column(QUARANTINED, flags)

    def _visible_rows(self, table: pa.Table, expected: int) -> pa.Table | None:
        """The rows of a file's decoded statistics this snapshot holds; None unless there are ``expected`` of them."""
        flags = table.column(QUARANTINED)
        quarantined = pc.sum(flags).as_py() or 0
        held = quarantined if self.quarantined else table.num_rows - quarantined
        if held != expected:
            return None
        if held == table.num_rows:
            return table
        return table.filter(flags if self.quarantined else pc.invert(flags))

    @cached_property
    def index(self) -> LazyIndex:
        """Index columns (+ meta and tensor refs) as NumPy in episode order, each decoded on first use."""
        derived = [f.key for f in self.schema.meta_fields if f.derived]
        return LazyIndex(self, [*self.index_columns(), *derived])

    def load_index_column(self, name: str) -> np.ndarray:
        """One index column in episode order (meta columns decoded to the schema dtype).

        After a grown scan, the older snapshot's decoded column is kept and
        only the new episodes are decoded.
        """
        f = self.schema[name] if name in {d.key for d in self.derived.fields} else None
        if f is not None:
            return decode_meta(self.derived_values().column(f.key), f)
        scan = self.scan()
        kept = self._base_columns.pop(name, None) if scan.kept else None
        if kept is not None and len(kept) == scan.kept:
            return append_rows(kept, self._decode(name, scan.order[scan.kept :]))
        return self._decode(name, scan.order)

    def _decode(self, name: str, rows: np.ndarray) -> np.ndarray:
        col = self.scan().table.column(name).take(pa.array(rows)).combine_chunks()
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
        keys = self._keys  # read by a where() before the index scan: counting does not make the scan
        return len(keys[1]) if keys is not None else len(self.index["episode_id"])

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

    def derived_values(self) -> pa.Table:
        """``episode_id`` and every derived column, one row per episode in episode order (NULL: never set).

        Read once from the side table at the version this snapshot records;
        rows of episodes not in this snapshot (deleted, evicted) are dropped.
        A snapshot grown from an older one that read them, with no update
        since, keeps its rows and adds NULL rows for the new episodes.
        """
        scan = self.scan()
        with self._lock:
            base, self._base_derived = self._base_derived, None
            grows = base is not None and base[0] == self.derived and scan.kept == base[1].num_rows > 0
            if self._derived_values is None and grows and base is not None:
                self._derived_values = _extended(base[1], self.index["episode_id"][scan.kept :])
            if self._derived_values is None:
                side = side_values(self.loc, self.derived)
                sorted_ids, pos = self._id_lookup
                ids = side.column(ID).to_numpy()
                at = np.searchsorted(sorted_ids, ids).clip(max=max(len(sorted_ids) - 1, 0))
                hit = sorted_ids[at] == ids if len(sorted_ids) else np.zeros(len(ids), dtype=bool)
                row = np.full(self.num_episodes, -1, dtype=np.int64)
                row[pos[at[hit]]] = np.flatnonzero(hit)
                taken = side.drop_columns([ID]).take(pa.array(row, mask=row < 0))
                ids_col = pa.array(self.index["episode_id"], pa.int64())
                self._derived_values = taken.add_column(0, ID, ids_col)
            return self._derived_values

    def table_field(self, f: FieldSpec) -> np.ndarray:
        """All rows of a small per-step field, episode after episode, schema dtype.

        A derived column's rows of episodes it was never set for hold its
        ``default`` (else NaN for floats, zero otherwise).
        """
        with self._lock:
            if f.key in self._fields:
                return self._fields[f.key]
        first = 0  # positions before it: rows kept from the snapshot this one grew from
        read: np.ndarray | None = None  # else the positions col holds (the others' rows kept from that snapshot)
        if f.derived:
            col = self.derived_values().column(f.key).combine_chunks()
        else:
            col, first, read = self._table_column(f)
        positions = np.arange(first, self.num_episodes) if read is None else read
        with self._lock:
            listed = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            want = np.diff(self.offsets(f))[positions]
            unset = col.is_null().to_numpy(zero_copy_only=False)
            listed = np.where(unset, want, listed)
            if len(listed) != len(want) or (listed != want).any():
                bad = int(np.flatnonzero(listed != want)[0]) if len(listed) == len(want) else 0
                eid = int(self.index["episode_id"][positions[bad]])
                raise CorruptionError(
                    f"episode {eid}: field {f.key!r} holds {listed[bad]} rows, its length implies {want[bad]}"
                )
            depth = 1 + len(f.shape) + (1 if f.np_dtype.kind == "c" else 0)
            values = flatten_lists(col, depth)
            rows = int(want[~unset].sum())
            inner = f.shape + ((2,) if f.np_dtype.kind == "c" else ())
            if values.size != rows * int(np.prod(inner, dtype=np.int64)):
                raise CorruptionError(
                    f"field {f.key!r}: table holds {values.size} values, episode lengths imply {rows} rows"
                )
            arr = from_storage(values.reshape(rows, *inner), f.np_dtype)
            if unset.any():
                arr = _with_unset_rows(f, arr, np.repeat(unset, want))
            if first:
                arr = append_rows(self._base_fields.pop(f.key), arr)
            elif read is not None:
                arr = self._around_kept(f, arr, read)
            self._fields[f.key] = arr
            return arr

    def _around_kept(self, f: FieldSpec, arr: np.ndarray, read: np.ndarray) -> np.ndarray:
        """All rows of ``f``: those of positions ``read`` (``arr``) and the kept ones of the older snapshot."""
        scan = self.scan()
        assert scan.base_position is not None and scan.base_lengths is not None
        base = self._base_fields.pop(f.key)
        source = scan.base_position[scan.order]
        offsets = self.offsets(f)
        rows = np.diff(offsets)
        start = np.empty(len(rows), np.int64)
        kept = source >= 0
        base_rows = scan.base_lengths + extra_rows(f)
        start[kept] = (np.cumsum(base_rows) - base_rows)[source[kept]]
        start[read] = len(base) + np.cumsum(rows[read]) - rows[read]
        pool = np.concatenate([base, arr])
        return pool[np.repeat(start - offsets[:-1], rows) + np.arange(offsets[-1])]

    def _table_column(self, f: FieldSpec) -> tuple[pa.Array, int, np.ndarray | None]:
        """``(f's list column of the positions read, first, read)``: positions ``first`` on, or ``read``.

        After a grown scan (appends only) the positions kept from the older
        snapshot keep its decoded rows (``first`` = their number) and only the
        table files added since are read: a learner's refresh reads O(new
        episodes). After an eviction, a delete or a compaction, the episodes
        of the files still there keep theirs and only those of the files added
        since are read (``read``: their positions). Otherwise the whole table
        is read (``first`` = 0, ``read`` None).
        """
        scan = self.scan()
        kept = self._base_fields.get(f.key)
        read = None
        if kept is not None and scan.kept and len(kept) == self.offsets(f)[scan.kept]:
            read = np.arange(scan.kept, len(scan.order))
        elif kept is not None and scan.base_position is not None and scan.base_lengths is not None:  # noqa: SIM102
            if len(kept) == (scan.base_lengths + extra_rows(f)).sum():  # the older snapshot's rows all decoded
                read = np.flatnonzero(scan.base_position[scan.order] < 0)
        if read is not None:
            with self._lock:
                if f.key not in self._new_rows:  # every field kept from the base, in one read of the new files
                    self._new_rows.update(self._read_rows(scan, list(self._base_fields), read))
                col = self._new_rows.pop(f.key)
            return (col, scan.kept, None) if scan.kept else (col, 0, read)
        self._base_fields.pop(f.key, None)
        tbl = self._read_table(["episode_id", f.key])
        pos = self.positions_of(tbl.column("episode_id").to_numpy())
        return tbl.column(f.key).combine_chunks().take(pa.array(np.argsort(pos))), 0, None

    def _read_rows(self, scan: IndexScan, keys: list[str], positions: np.ndarray) -> dict[str, pa.Array]:
        """Columns ``keys`` of the episodes at ``positions`` (increasing), in that order, read from their files only."""
        rows = scan.order[positions]
        at = np.full(scan.table.num_rows, -1, np.int64)
        at[rows] = np.arange(len(rows))
        pieces = [(at[r], t) for r, t in self.read_files(keys, np.unique(scan.file[rows]))]
        pieces = [(a[a >= 0], t.filter(pa.array(a >= 0))) for a, t in pieces]
        if not pieces:
            schema = self.arrow_dataset().schema
            return {k: pa.array([], schema.field(k).type) for k in keys}
        order = pa.array(np.argsort(np.concatenate([a for a, _ in pieces]), kind="stable"))
        return {k: pa.concat_arrays([t.column(k).combine_chunks() for _, t in pieces]).take(order) for k in keys}

    def tensor_array(self, writer: str, f: FieldSpec, commit: int = 0) -> ArrayReader:
        """The array holding ``writer``'s rows of ``f`` (``commit`` 0: its single array); see :meth:`tensor_arrays`."""
        return self.tensor_arrays(f, [(writer, commit)])[0]

    def tensor_arrays(self, f: FieldSpec, arrays: Sequence[tuple[str, int]]) -> list[TensorArray | PlainArray]:
        """The ``(writer, commit)`` arrays of ``f``, opened once per process (missing ones all at once).

        A process forked from one that used TensorStore reads through
        :class:`~episodelake.storage.planned.PlainArray` instead, and so does every
        process for object stores (planned byte ranges through the read cache)
        and for compressed and lossy fields (chunks decoded in a thread pool
        and kept in the decoded-chunk cache); handles opened before a fork are
        never used after it.
        """
        if self._arrays_pid != os.getpid():  # forked: a parent thread may have held the lock at fork time
            self._lock = threading.Lock()
            self._arrays, self._arrays_pid = {}, os.getpid()
        with self._lock:
            missing = list(dict.fromkeys(a for a in arrays if (*a, f.key) not in self._arrays))
            # object stores: planned, coalesced byte ranges through the read cache; compressed chunks decode in a
            # thread pool into the decoded-chunk cache (codecs.ChunkCache)
            if not engine_usable() or f.framed or f.compression is not None or not self.loc.is_local:
                opened: list[TensorArray | PlainArray] = list(
                    PlainArray.open_many(self.loc, missing, f) if missing else []
                )
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

    def _verify_rows(self, f: FieldSpec, p: int, arr: ArrayReader, start: int, stop: int) -> None:
        where = f"episode {int(self.index['episode_id'][p])}: field {f.key!r} rows [{start}, {stop}) of {arr.where}"
        try:
            rows = read_many([(arr, start, stop)])[0]
        except ValueError as exc:
            raise CorruptionError(f"{where} unreadable: {exc}") from exc
        if zlib.crc32(np.ascontiguousarray(rows).data) != int(self.index[f"crc/{f.key}"][p]):
            raise CorruptionError(f"{where} fail their CRC-32 check")
        self._verified.add((f.key, p))


def _read_pool() -> pa.MemoryPool:
    """The memory pool of :meth:`Snapshot.read_files`: jemalloc where pyarrow has it, else the default.

    pyarrow's default mimalloc pool asks for transparent huge pages; where
    memory is fragmented (after the index scan), each 2 MiB fault of a large
    read waits for the kernel to compact memory: reading the statistics of
    250k episodes (150 MB decoded) spent 0.5-0.6 s in the kernel from
    mimalloc, 0.1-0.2 s from jemalloc's 4 KiB pages.
    """
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


def _mapped(whole: pads.Dataset, fragments: list[pads.Fragment]) -> pads.Dataset:
    """``fragments`` of ``whole`` as one dataset, read through memory maps when they are local files.

    Read into memory instead, each column chunk is first copied out of the
    page cache into fresh buffers: reading the statistics of 250k episodes
    (150 MB) took 0.5-0.7 s that way, mostly in the kernel, against 0.14-0.27 s
    mapped. Decoded arrays never point into the mapping, and table files are
    immutable, so a mapping never sees one change.
    """
    fs = whole.filesystem
    if not (isinstance(fs, pafs.SubTreeFileSystem) and isinstance(fs.base_fs, pafs.LocalFileSystem)):
        return pads.FileSystemDataset(fragments, whole.schema, whole.format, fs)
    mapped = pafs.SubTreeFileSystem(fs.base_path, pafs.LocalFileSystem(use_mmap=True))
    # pre-buffering would copy the mapped ranges into buffers again
    fmt = pads.ParquetFileFormat(
        read_options=whole.format.read_options,
        default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=False),
    )
    picked = [fmt.make_fragment(f.path, mapped, f.partition_expression) for f in fragments]
    return pads.FileSystemDataset(picked, whole.schema, fmt, mapped)


def _extended(values: pa.Table, ids: np.ndarray) -> pa.Table:
    """``values`` (derived values) followed by one all-NULL row for each episode of ``ids``."""
    tail = {ID: pa.array(ids, pa.int64())}
    tail |= {f.name: pa.nulls(len(ids), f.type) for f in values.schema if f.name != ID}
    return pa.concat_tables([values, pa.table(tail, schema=values.schema)])


def _with_unset_rows(f: FieldSpec, values: np.ndarray, unset: np.ndarray) -> np.ndarray:
    """``values`` (the set rows) spread over all rows, the ``unset`` ones holding the derived column's fill."""
    if f.default_value is not None:
        fill: Any = f.default_value
    else:
        fill = np.nan if f.np_dtype.kind in "fc" else 0
    out = np.empty((len(unset), *f.shape), f.np_dtype)
    out[unset] = fill
    out[~unset] = values
    return out


def table_key(table: pa.Table, row: int) -> tuple[int, int]:
    """The ``(created_at, episode_id)`` episode-order key of ``table``'s row ``row``."""
    return table.column("created_at")[row].cast(pa.int64()).as_py(), table.column("episode_id")[row].as_py()


def _quarantine_filter(schema: pa.Schema, quarantined: bool) -> pc.Expression | None:
    """The rows a snapshot holds: not quarantined (NULL: rows written before the column), or only quarantined ones.

    None: the table has no quality columns, every row is kept (``quarantined`` asks for none of them).
    """
    if QUARANTINED not in schema.names:
        return pc.scalar(False) if quarantined else None
    # coalesce, not is_null: files written before the column hold none of it, and Arrow prunes them on is_null
    flag = pc.coalesce(pc.field(QUARANTINED), pa.scalar(False))
    return flag if quarantined else pc.invert(flag)


def _keys(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(created_at`` in microseconds, ``episode_id)`` of each of ``table``'s rows, as int64."""
    created = table.column("created_at").combine_chunks().cast(pa.int64()).to_numpy()
    return created, table.column("episode_id").combine_chunks().to_numpy()


def _order_keys(table: pa.Table, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The episode-order keys of ``table``'s rows taken in ``order`` (None: episode order, sorted here)."""
    created, ids = _keys(table)
    order = np.lexsort((ids, created)) if order is None else order
    return created[order], ids[order]


def _episode_order(table: pa.Table) -> np.ndarray:
    """The permutation putting ``table``'s rows in episode order ``(created_at, episode_id)``."""
    created, ids = _keys(table)
    return np.lexsort((ids, created))
