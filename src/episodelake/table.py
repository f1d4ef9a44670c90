"""The Delta Lake episode table: one row per episode, committed atomically.

Columns: ``episode_id`` (int64, unique and stable), ``writer``, ``length``,
``terminated``, ``truncated``, ``return``, ``created_at``, one column per meta
field, one list column per small per-step field (``[T(+1)][dims...]``), and for
each tensor field ``ref/<key>`` (first row in the writer's array) and
``crc/<key>`` (CRC-32 of the episode's rows). Every numeric per-step field
also has mergeable statistics ``stats/<key>/{count,sum,sumsq,min,max}`` (lists
over channels). The commit log gives atomic appends, optimistic concurrency,
versions and time travel.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from . import layout
from .errors import ArgumentError, CommitConflictError, DatasetNotFoundError
from .location import Location
from .schema import DatasetSchema
from .stats import STAT_PARTS, has_stats, stat_column

COMPACT_EVERY = 64  # commits between automatic compactions + checkpoints
COMMIT_RETRIES = 20
COMPACT_LOCK_STALE_S = 600.0


def arrow_schema(schema: DatasetSchema) -> pa.Schema:
    """The episode table's Arrow schema for a dataset schema."""
    cols: list[pa.Field] = [
        pa.field("episode_id", pa.int64(), nullable=False),
        pa.field("writer", pa.string(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("terminated", pa.bool_(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
        pa.field("return", pa.float64()),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
    for f in schema.meta_fields:
        cols.append(pa.field(f.key, f.arrow_type()))
    for f in schema.step_fields:
        if f.in_tensor:
            cols.append(pa.field(f"ref/{f.key}", pa.int64(), nullable=False))
            cols.append(pa.field(f"crc/{f.key}", pa.int64(), nullable=False))
        else:
            cols.append(pa.field(f.key, f.arrow_type(), nullable=False))
    for f in schema.step_fields:
        if has_stats(f):
            cols.append(pa.field(stat_column(f, "count"), pa.int64()))
            for part in STAT_PARTS[1:]:
                cols.append(pa.field(stat_column(f, part), pa.list_(pa.float64())))
    return pa.schema(cols)


class EpisodeTable:
    """A Delta table handle pinned to one version (``refresh()`` moves it)."""

    def __init__(self, loc: Location, dt: DeltaTable) -> None:
        self.loc = loc
        self.dt = dt
        self._commits_since_compact = 0
        self._compactor: threading.Thread | None = None
        self._checkpoint_stamp = (-1, -1)  # (mtime, version) of the last _last_checkpoint read

    @classmethod
    def create(cls, loc: Location, schema: pa.Schema, partition_by: list[str]) -> EpisodeTable:
        # File statistics only for the leading scalar columns (ids, flags, meta, refs): the list
        # columns' min/max would cost every commit time and skip no file.
        scalars = next((i for i, f in enumerate(schema) if pa.types.is_list(f.type)), len(schema))
        dt = DeltaTable.create(
            loc.delta_uri(),
            schema=schema,
            partition_by=partition_by or None,
            storage_options=loc.delta_options(),
            mode="error",
            configuration={"delta.dataSkippingNumIndexedCols": str(scalars)},
        )
        return cls(loc, dt)

    @classmethod
    def open(cls, loc: Location, version: int | None = None) -> EpisodeTable:
        try:
            dt = DeltaTable(loc.delta_uri(), version=version, storage_options=loc.delta_options())
        except TableNotFoundError as exc:
            raise DatasetNotFoundError(f"no episode table at {loc.delta_uri()}") from exc
        except Exception as exc:  # deltalake raises plain errors for unknown versions
            if version is not None:
                raise ArgumentError(f"version {version} does not exist at {loc.url}: {exc}") from exc
            raise
        return cls(loc, dt)

    @property
    def version(self) -> int:
        return self.dt.version()

    def refresh(self) -> None:
        """Move to the latest version; on local disk a no-op costs one file lookup (a learner polls this)."""
        if self.loc.is_local and not self._newer_on_disk():
            return
        self.dt.update_incremental()

    def _newer_on_disk(self) -> bool:
        """Whether the log holds a version after the pinned one: its entry, or a newer checkpoint.

        Every commit writes the next entry; log cleanup removes old entries
        only behind a checkpoint, which ``_last_checkpoint`` then names.
        """
        version = self.version
        if os.path.exists(self.loc.child(*layout.log_entry_parts(version + 1))):
            return True
        path = self.loc.child(*layout.last_checkpoint_parts())
        try:
            stamp = os.stat(path).st_mtime_ns
            if stamp != self._checkpoint_stamp[0]:  # parsed again only when rewritten
                with open(path, "rb") as fh:
                    self._checkpoint_stamp = (stamp, int(json.loads(fh.read())["version"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return False
        return self._checkpoint_stamp[1] > version

    def dataset(self) -> pads.Dataset:
        """The pinned snapshot as an Arrow dataset (pushdown, partition pruning).

        A local unpartitioned table's dataset is built from its file list
        alone: deltalake's attaches every file's min/max statistics as an
        expression, O(files) of work on each snapshot (most of a learner's
        refresh before a compaction); Arrow still skips row groups by their
        Parquet statistics.
        """
        fs = self.loc.arrow_filesystem(*layout.table_parts())
        if self.loc.is_local and not self.dt.metadata().partition_columns:
            root = self.loc.child(*layout.table_parts()) + "/"
            files = self.dt.file_uris()
            if all(f.startswith(root) for f in files):
                return pads.FileSystemDataset.from_paths(
                    [f[len(root) :] for f in files],
                    schema=pa.schema(self.dt.schema().to_arrow()),
                    format=pads.ParquetFileFormat(
                        default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True)
                    ),
                    filesystem=fs,
                )
        return self.dt.to_pyarrow_dataset(filesystem=fs)

    def read(self, columns: list[str], filter: Any = None) -> pa.Table:
        return self.dataset().to_table(columns=columns, filter=filter)

    def append(self, rows: pa.Table) -> int:
        """Append ``rows`` in one commit (retrying conflicts); return the new version."""
        return self._commit(lambda: write_deltalake(self.dt, rows, mode="append"))

    def commit(
        self, plan: Callable[[], tuple[pa.Table, Sequence[int]]], landed: Callable[[int], None] | None = None
    ) -> int:
        """One commit that adds rows and removes episodes by id, as ``plan()`` says at the latest version.

        ``plan`` runs again after every conflict (at the version that won), so
        what it removes is always decided on the version the commit lands on.
        Rows of a removed episode stay in the files of older versions (time
        travel) until :meth:`vacuum`. ``landed`` is told the latest version
        right after the commit (before any compaction). Returns the new version.
        """

        def attempt() -> None:
            self.dt.update_incremental()
            rows, remove = plan()
            if not len(remove):
                write_deltalake(self.dt, rows, mode="append")
                return
            # replaceWhere: files holding a matching row are rewritten without it, in the same
            # commit that adds ``rows``. deltalake requires the added rows to match the predicate.
            ids = ", ".join(str(int(i)) for i in [*remove, *rows["episode_id"].to_pylist()])
            write_deltalake(self.dt, rows, mode="overwrite", predicate=f"episode_id IN ({ids})")

        return self._commit(attempt, landed)

    def clear(self, schema: pa.Schema) -> int:
        """Remove every episode of the latest version in one commit; return the new version."""
        empty = schema.empty_table()

        def attempt() -> None:
            self.dt.update_incremental()
            write_deltalake(self.dt, empty, mode="overwrite")

        return self._commit(attempt)

    def _commit(self, attempt: Callable[[], None], landed: Callable[[int], None] | None = None) -> int:
        """Run ``attempt`` (one Delta commit) until it lands, backing off on conflicts; compact every so often."""
        delay = 0.01
        for n in range(COMMIT_RETRIES):
            try:
                attempt()
                break
            except CommitFailedError as exc:
                if n == COMMIT_RETRIES - 1:
                    raise CommitConflictError(f"commit to {self.loc.url} failed {COMMIT_RETRIES} times: {exc}") from exc
                time.sleep(delay)  # back off before retrying a lost optimistic-concurrency race
                delay = min(delay * 2, 1.0)
                self.dt.update_incremental()
        # write_deltalake moved self.dt to the version it committed: no update_incremental here
        if landed is not None:
            landed(self.version)
        self._commits_since_compact += 1
        if self._commits_since_compact >= COMPACT_EVERY:
            if self.loc.is_local:
                self._compact_in_background()
            else:
                # No lock file on object stores, and concurrent compactions would duplicate
                # rows: writers only checkpoint (idempotent); ds.compact() is explicit there.
                self.dt.create_checkpoint()
                self._commits_since_compact = 0
        return self.version

    def _compact_in_background(self) -> None:
        """Start :func:`compact_table` on a thread of its own, so the commit that triggered it returns at once.

        It reads and commits through its own table handle (this one stays the
        writer's); one runs at a time per handle (while one runs, the count
        keeps growing and the next commit tries again). Joined at interpreter
        exit by a ``threading`` exit hook (:func:`join_compactions`).
        """
        if self._compactor is not None and self._compactor.is_alive():
            return
        self._commits_since_compact = 0
        thread = threading.Thread(target=_compact_quietly, args=(self.loc,), name="episodelake-compact", daemon=True)
        self._compactor = thread
        with _COMPACTORS_LOCK:
            _COMPACTORS.add(thread)
        thread.start()

    @property
    def compactor(self) -> threading.Thread | None:
        """The background compaction thread last started by this handle's commits (None: none yet)."""
        return self._compactor

    def compact(self) -> None:
        """Merge small files and write a checkpoint so opening stays fast (in this thread, waiting for it)."""
        compact_table(self.loc, self.dt)
        self.dt.update_incremental()
        self._commits_since_compact = 0

    def history(self) -> list[dict[str, Any]]:
        return self.dt.history()

    def file_uris(self) -> list[str]:
        return self.dt.file_uris()

    def add_actions(self) -> list[dict[str, Any]]:
        """The data files of the pinned version as its log records them, one dict each.

        Keys: ``path`` (relative to the table directory), ``size_bytes``,
        ``num_records``, ``partition.<column>`` and the ``min.<column>`` /
        ``max.<column>`` statistics.
        """
        return pa.table(self.dt.get_add_actions(flatten=True)).to_pylist()

    def file_set(self) -> set[str]:
        """Paths of the pinned version's data files, relative to the table directory (``changes``)."""
        return set(pa.table(self.dt.get_add_actions(flatten=True)).column("path").to_pylist())

    def episode_ids_in(self, rels: Iterable[str]) -> np.ndarray:
        """The ``episode_id`` column of the data files ``rels`` (relative paths), concatenated (int64)."""
        parts = [read_table_file(self.loc, self.file_path(rel), ["episode_id"]).column(0) for rel in sorted(rels)]
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if parts else np.zeros(0, np.int64)

    def file_path(self, rel: str) -> str:
        """Filesystem path of a data file named relative to the table directory (as the log names it)."""
        return self.loc.child(*layout.table_parts(rel))

    def stored_files(self) -> dict[str, int]:
        """Every Parquet data file on storage, referenced or not (log checkpoints excluded): path -> bytes."""
        return stored_files(self.loc)

    def vacuum(self, retention_hours: float, dry_run: bool) -> list[str]:
        """Delete data files no retained version references that are older than ``retention_hours``.

        Returns their paths (sorted), only those still on storage (the log
        also names files an earlier vacuum deleted). ``dry_run`` deletes
        nothing. The handle moves to the latest version afterwards (unless
        ``dry_run``).
        """
        on_disk = stored_files(self.loc)
        doomed = self.dt.vacuum(
            retention_hours=math.ceil(retention_hours) if retention_hours else 0,
            dry_run=dry_run,
            enforce_retention_duration=False,
            full=True,
        )
        if not dry_run:
            self.refresh()
        return sorted(path for path in map(self.file_path, doomed) if path in on_disk)


def stored_files(loc: Location) -> dict[str, int]:
    """The Parquet data files under ``loc``'s table directory (the log excluded), path -> bytes."""
    root = loc.child(*layout.table_parts())
    log = loc.child(*layout.log_parts()) + "/"
    found = loc.fs.find(root, detail=True)
    return {
        path: int(info["size"])
        for path, info in found.items()
        if path.endswith(layout.DATA_SUFFIX) and not path.startswith(log)
    }


def log_entries(loc: Location) -> list[str]:
    """Paths of the commit entries (one JSON file per version) of the Delta log at ``loc``, sorted."""
    return sorted(loc.fs.glob(loc.child(*layout.log_parts(), layout.LOG_ENTRY_PATTERN)))


def read_table_file(loc: Location, path: str, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file, read whole in this thread and decoded from memory.

    Handing Arrow a Python file object lets Arrow's IO threads call back into
    Python (read-ahead); one still doing so when the interpreter exits aborts
    the process ("terminate called without an active exception").
    """
    return pq.read_table(pa.BufferReader(loc.fs.cat_file(path)), columns=columns)


def log_problems(loc: Location) -> list[tuple[str, str]]:
    """``(path, what is wrong)`` of each unparseable log entry (not one JSON action per line) and checkpoint."""
    out: list[tuple[str, str]] = []
    for path in log_entries(loc):
        try:
            with loc.fs.open(path, "rb") as fh:
                for line in fh.read().decode().splitlines():
                    if line.strip():
                        json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            out.append((path, f"commit entry is not valid JSON: {exc}"))
    for path in sorted(loc.fs.glob(loc.child(*layout.log_parts(), layout.CHECKPOINT_PATTERN))):
        try:
            pq.read_metadata(pa.BufferReader(loc.fs.cat_file(path)))
        except (OSError, pa.ArrowException) as exc:
            out.append((path, f"checkpoint unreadable: {exc}"))
    return out


def compact_table(loc: Location, dt: DeltaTable) -> None:
    """Merge small files of the latest version and write a checkpoint, through the handle ``dt``.

    deltalake lets two compactions of the same files both commit (their
    removes carry dataChange=false, which its conflict checker accepts),
    and every row the two share is then duplicated. So a compaction
    starts from the latest version and, on local disk, holds an exclusive
    lock file; a compaction that finds it held is skipped (nothing changes).
    """
    if not _lock_compaction(loc):
        return
    try:
        dt.update_incremental()
        dt.optimize.compact()
        dt.create_checkpoint()
    except CommitFailedError:
        pass  # lost a race with another writer; the data is unchanged
    finally:
        if loc.is_local:
            os.remove(loc.child(*layout.compact_lock_parts()))


def _lock_compaction(loc: Location) -> bool:
    """Create the compaction lock (local disk only; a lock older than COMPACT_LOCK_STALE_S is broken)."""
    if not loc.is_local:
        return True  # object stores: no lock file (see docs/reliability.md)
    path = loc.child(*layout.compact_lock_parts())
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            try:
                if time.time() - os.path.getmtime(path) < COMPACT_LOCK_STALE_S:
                    return False
                os.remove(path)  # left by a compactor that was killed
            except FileNotFoundError:
                pass
    return False


def _compact_quietly(loc: Location) -> None:
    """A background compaction: its own handle on the latest version; a table removed meanwhile is no error."""
    try:
        dt = DeltaTable(loc.delta_uri(), storage_options=loc.delta_options())
        compact_table(loc, dt)
    except Exception:
        if os.path.isdir(loc.child(*layout.log_parts())):
            raise  # a real failure: threading's excepthook reports it
        # else the dataset was removed meanwhile (a temporary or in-memory dataset dropped): nothing to compact
    finally:
        with _COMPACTORS_LOCK:
            _COMPACTORS.discard(threading.current_thread())


_COMPACTORS: set[threading.Thread] = set()
_COMPACTORS_LOCK = threading.Lock()


def join_compactions() -> None:
    """Wait for every background compaction this process started (run at interpreter exit, callable any time)."""
    with _COMPACTORS_LOCK:
        running = list(_COMPACTORS)
        _COMPACTORS.clear()
    for thread in running:
        if thread is not threading.current_thread():
            thread.join()


# threading's exit hooks run at the start of interpreter shutdown (before atexit callbacks and native
# destructors); they run newest first, so the exit commit of commit.py (registered later) runs before this.
threading._register_atexit(join_compactions)  # type: ignore[attr-defined]
