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

import contextlib
import json
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from ..core import lifecycle
from ..core.errors import (
    ArgumentError,
    CommitConflictError,
    CorruptionError,
    DatasetNotFoundError,
    EpisodeLakeError,
    SchemaError,
)
from ..core.schema import DatasetSchema
from ..core.stats import STAT_PARTS, has_stats, stat_column
from . import layout, table_cache
from .faults import quiet_panics, storage_fault
from .location import Location

COMPACT_EVERY = 64  # commits between automatic compactions + checkpoints
MIN_FILE_BYTES = 1 << 16  # a capacity dataset's compaction merges files up to at least this size
COMMIT_RETRIES = 20
COMPACT_LOCK_STALE_S = 600.0
LOG_READ_TRIES = 2  # reads of the log deciding whether a commit already landed (each within the deadline)

# Vacuum (docs/reliability.md, "Vacuum and compaction"). A file no version of the log references is either a
# crash leftover or part of a commit still in flight (written, not yet committed: seconds, at most the commit's
# retries). It is removed only once older than UNREFERENCED_FLOOR_HOURS, whatever retention is asked for: an
# hour is orders of magnitude longer than any commit takes (COMMIT_RETRIES attempts with backoff capped at 1 s)
# and covers clock skew between a host and its object store.
UNREFERENCED_FLOOR_HOURS = 1.0
# Below this retention, versions superseded less than that long ago lose their files (time travel to them and
# readers pinned to them fail), so a shorter one needs ``break_old_versions=True``. One hour: the default of a
# replay buffer's Capacity.retention_hours; plain vacuum keeps Delta's 168 h by default.
MIN_RETENTION_HOURS = 1.0

# Commit properties (Delta commitInfo custom metadata) naming what each episodelake commit did.
OPERATION_KEY = "episodelake.operation"
ADDED_KEY = "episodelake.episodes_added"
REMOVED_KEY = "episodelake.episodes_removed"
TOKEN_KEY = "episodelake.commit"  # identifies one logical commit across its attempts (lost responses)
SCHEMA_KEY = b"episodelake.schema"  # field metadata of episode_id: the schema of a version after a schema edit
UNCHECKED = b""  # a commit's ``stamp`` when its rows fit any schema edit (never a recorded schema: JSON)


QUARANTINED = "quarantined"  # the quality column of quarantined episodes (``rows.QUALITY_COLUMNS``)


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
        self.file_shares = 1  # compaction keeps files below 1/file_shares of the table (capacity datasets: 16)
        self.auto_compact = True  # compact every COMPACT_EVERY commits (off: a capacity buffer's vacuum compacts)
        self._commits_since_compact = 0
        self._compactor: threading.Thread | None = None
        self._checkpoint_stamp = (-1, -1)  # (mtime, version) of the last _last_checkpoint read
        self._uncertain: int | None = None  # a commit failed on a storage fault after this version: it may have landed
        self._compaction_error: BaseException | None = None  # the last background compaction's failure, not yet raised

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
            if version is not None and _log_kept(loc):  # the version's log entries were trimmed (trim_log)
                raise ArgumentError(
                    f"version {version} is no longer kept at {loc.url}: its log entries were removed "
                    "(a capacity dataset keeps its last capacity.keep_versions versions; docs/replay.md)"
                ) from exc
            raise DatasetNotFoundError(f"no episode table at {loc.delta_uri()}") from exc
        except Exception as exc:  # deltalake raises plain errors for unknown versions
            doing = "opening the episode table" if version is None else f"opening version {version}"
            fault = storage_fault(exc, dataset=loc.url, object=loc.delta_uri(), doing=doing, endpoint=loc.endpoint)
            if fault is not None:  # an unreachable store says nothing about whether the version exists
                raise fault from exc
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
        try:
            self.dt.update_incremental()
        except Exception as exc:
            raise table_error(exc, self.loc, "refreshing the episode table") from exc

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

    def schema_stamp(self) -> bytes | None:
        """The schema a schema edit recorded in the loaded version (:data:`SCHEMA_KEY`); None: the descriptor's."""
        first = self.dt.schema().fields[0]  # episode_id, every version's first column; no Arrow conversion
        raw = first.metadata.get(SCHEMA_KEY.decode())
        return raw.encode() if isinstance(raw, str) else None

    def _check_stamp(self, stamp: bytes | None, rows: pa.Table) -> None:
        """:class:`SchemaError` when a schema edit other than ``stamp`` is in the loaded version (``b""``: any)."""
        if stamp != UNCHECKED and self.schema_stamp() != stamp:
            raise SchemaError(
                f"dataset {self.loc.url}: its fields were edited (version {self.version}) after these "
                f"{len(rows)} episode(s) were recorded; they were not committed: reopen the dataset to write"
            )

    def append(self, rows: pa.Table, stamp: bytes | None = UNCHECKED, token: str | None = None) -> int:
        """Append ``rows`` in one commit (retrying conflicts); return the new version.

        ``stamp``: the :meth:`schema_stamp` the rows were built under; a
        schema edit that lands first makes the commit conflict, and its retry
        raises :class:`SchemaError` (:data:`UNCHECKED`: not checked).
        ``token``: the commit's token (:meth:`find_commit` finds it in the log;
        default: one derived from the rows' episode ids).
        """
        token = token or rows_token(rows)
        tries = [0]

        def attempt() -> None:
            if tries[0]:  # after a conflict: a schema edit may have won it
                self._check_stamp(stamp, rows)
            tries[0] += 1
            props = _props("APPEND", token, len(rows), 0)
            fitted = _fitted(self.dt, rows)
            merge = _merged(self.dt, fitted)
            write_deltalake(self.dt, fitted, mode="append", schema_mode=merge, commit_properties=props)

        return self._commit(attempt, token=token)

    def commit(
        self,
        plan: Callable[[], tuple[pa.Table, Sequence[int]]],
        landed: Callable[[int], None] | None = None,
        operation: str | None = None,
        stamp: bytes | None = UNCHECKED,
        span: bool = False,
        token: str | None = None,
    ) -> int:
        """One commit that adds rows and removes episodes by id, as ``plan()`` says at the latest version.

        ``plan`` runs again after every conflict (at the version that won), so
        what it removes is always decided on the version the commit lands on.
        Rows of a removed episode stay in the files of older versions (time
        travel) until :meth:`vacuum`. ``landed`` is told the latest version
        right after the commit (before any compaction). Returns the new version.
        History names it ``operation`` when given (edits: ``TRIM``, ``SPLIT``, ``SET META``), else
        ``APPEND``, ``EVICT`` (adds and removes) or ``DELETE`` (only removes).
        ``stamp``: as for :meth:`append`. ``span=True``: the rows replace every
        episode whose id lies between the smallest and largest id removed or
        added (``plan`` returns those of that range that stay, unchanged):
        deltalake evaluates that range far faster than a long ``IN`` list
        (measured 20x at 10,000 ids). ``token``: as for :meth:`append`.
        """
        current: list[str | None] = [token]

        def attempt() -> None:
            self.dt.update_incremental()
            rows, remove = plan()
            rows = _fitted(self.dt, rows)
            self._check_stamp(stamp, rows)
            current[0] = token or (rows_token(rows) if len(rows) else current[0] or uuid.uuid4().hex)
            if not len(remove):
                props = _props("APPEND", current[0], len(rows), 0)
                merge = _merged(self.dt, rows)
                write_deltalake(self.dt, rows, mode="append", schema_mode=merge, commit_properties=props)
                return
            # replaceWhere: files holding a matching row are rewritten without it, in the same
            # commit that adds ``rows``. deltalake requires the added rows to match the predicate.
            ids = [int(i) for i in [*remove, *rows["episode_id"].to_pylist()]]
            name = operation or ("EVICT" if len(rows) else "DELETE")
            props = _props(name, current[0], len(rows), len(remove))
            if span:
                predicate = f"episode_id >= {min(ids)} AND episode_id <= {max(ids)}"
            else:
                predicate = f"episode_id IN ({', '.join(map(str, ids))})"
            merge = _merged(self.dt, rows)  # an eviction that records the first quality failure adds its columns
            write_deltalake(
                self.dt, rows, mode="overwrite", predicate=predicate, schema_mode=merge, commit_properties=props
            )

        return self._commit(attempt, landed, token=lambda: current[0])

    def rewrite(self, plan: Callable[[], pa.Table], operation: str) -> int:
        """Replace every row and the table schema by ``plan()``'s, planned at the latest version, in one commit.

        The schema edits (``DROP FIELDS``, ``RENAME FIELD``): an overwrite over
        the whole table (predicate ``true``), so an append that lands first
        conflicts and ``plan`` runs again at the version that won; the schema
        and its field metadata are the new rows'. Returns the new version.
        """
        token = uuid.uuid4().hex

        def attempt() -> None:
            self.dt.update_incremental()
            removed = self.dt.count()
            rows = plan()
            parts = self.dt.metadata().partition_columns or None
            props = _props(operation, token, len(rows), removed)
            write_deltalake(
                self.dt,
                rows,
                mode="overwrite",
                predicate="true",
                schema_mode="overwrite",
                partition_by=parts,
                commit_properties=props,
            )

        return self._commit(attempt, token=token)

    def clear(self, schema: pa.Schema) -> int:
        """Remove every episode of the latest version in one commit; return the new version."""
        empty = schema.empty_table()
        token = uuid.uuid4().hex

        def attempt() -> None:
            self.dt.update_incremental()
            removed = self.dt.count()
            write_deltalake(self.dt, empty, mode="overwrite", commit_properties=_props("CLEAR", token, 0, removed))

        return self._commit(attempt, token=token)

    def _commit(
        self,
        attempt: Callable[[], None],
        landed: Callable[[int], None] | None = None,
        token: str | Callable[[], str | None] | None = None,
    ) -> int:
        """Run ``attempt`` (one Delta commit) until it lands, backing off on conflicts; compact every so often.

        deltalake's own retries are off (:func:`_props`): when the response to a
        commit is lost, its retried write finds the version taken (by itself)
        and, retrying internally, would commit the same rows again. Here, after
        a failed attempt (and before the first attempt following a call that
        failed on a storage fault) the log since is searched for the commit's
        ``token``: found, the commit landed and is not repeated.
        """
        token_of = token if callable(token) else (lambda: token)
        if self._uncertain is not None and self._landed(token_of(), self._uncertain):
            self._uncertain = None
            return self.version
        delay = 0.01
        for n in range(COMMIT_RETRIES):
            read = self.version
            try:
                with quiet_panics():  # a failed file write makes deltalake's runtime print a panic report
                    attempt()
                break
            except CommitFailedError as exc:
                if self._landed(token_of(), read):
                    break
                if n == COMMIT_RETRIES - 1:
                    raise CommitConflictError(
                        f"commit to {self.loc.url} conflicted {COMMIT_RETRIES} times with concurrent commits: {exc}"
                    ) from exc
            except EpisodeLakeError:
                raise
            except Exception as exc:
                err = table_error(exc, self.loc, "commit to the episode table")
                if isinstance(err, CorruptionError) and self._moved() and n < COMMIT_RETRIES - 1:
                    # a file of the version it read went meanwhile (compacted away, then vacuumed with
                    # break_old_versions): the version that won is read again, as after a conflict
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                self._uncertain = read  # a write may have landed although its response was lost
                raise err from exc
            time.sleep(delay)  # back off before retrying a lost optimistic-concurrency race
            delay = min(delay * 2, 1.0)
            self.dt.update_incremental()
        self._uncertain = None
        # write_deltalake moved self.dt to the version it committed: no update_incremental here
        if landed is not None:
            landed(self.version)
        self._commits_since_compact += 1
        if self._commits_since_compact >= COMPACT_EVERY and self.auto_compact:
            if self.loc.is_local:
                self._compact_in_background()
            else:
                # No lock file on object stores, and concurrent compactions would duplicate
                # rows: writers only checkpoint (idempotent); ds.maintenance.compact() is explicit there.
                try:
                    self.dt.create_checkpoint()
                except Exception:  # the commit landed; a checkpoint only speeds reads: the next commit tries again
                    return self.version
                self._commits_since_compact = 0
        return self.version

    def _moved(self) -> bool:
        """Whether a newer version than the pinned one exists (the handle moves to it)."""
        before = self.version
        try:
            self.dt.update_incremental()
        except Exception:
            return False
        return self.version > before

    def find_commit(self, token: str, since: int) -> bool:
        """Whether a commit after version ``since`` carries ``token``: the answer for a commit whose outcome a
        storage fault left unknown (its reply lost). Moves the handle to the latest version; a log that cannot
        be read (after one more try) raises :class:`StorageError` and the answer stays unknown."""
        return self._landed(token, since)

    def _landed(self, token: str | None, since: int) -> bool:
        """Whether a commit after version ``since`` carries ``token`` (moves the handle to the latest version).

        The log is read a second time on a failure (it is the answer that
        decides whether to commit again); still failing, the commit stays
        uncertain and the error is raised.
        """
        if token is None:
            return False
        delay = 0.05
        for n in range(LOG_READ_TRIES):
            try:
                self.dt.update_incremental()
                return any(self._carries(v, token) for v in range(self.version, since, -1))
            except Exception as exc:
                if n < LOG_READ_TRIES - 1:
                    time.sleep(delay)  # a transient fault: read the log again
                    delay *= 2
                    continue
                self._uncertain = since if self._uncertain is None else min(since, self._uncertain)
                raise table_error(exc, self.loc, "reading the episode table log") from exc
        raise AssertionError("unreachable")

    def _carries(self, version: int, token: str) -> bool:
        """Whether the log entry of ``version`` is a commit carrying ``token`` (a missing entry: no).

        The entry is read as a file (deltalake's ``history()`` on S3 fails
        with "Generic S3 error" without sending a request, deltalake 1.6).
        """
        try:
            text = self.loc.read_text(*layout.log_entry_parts(version))
        except FileNotFoundError:
            return False  # cleaned up behind a checkpoint: far older than a commit still in doubt
        for line in text.splitlines():
            if '"commitInfo"' in line:
                info = json.loads(line).get("commitInfo") or {}
                return bool(info.get(TOKEN_KEY) == token)
        return False

    def _compact_in_background(self) -> None:
        """Start :func:`compact_table` on a thread of its own, so the commit that triggered it returns at once.

        It reads and commits through its own table handle (this one stays the
        writer's); one runs at a time per handle (while one runs, the count
        keeps growing and the next commit tries again). Joined at interpreter
        exit by a ``threading`` exit hook (:func:`join_compactions`). A failure
        is reported once, as a one-line ``RuntimeWarning`` (no traceback), and
        raised again by the next :meth:`compact` on this handle; commits go on
        (a compaction changes no data).
        """
        if self._compactor is not None and self._compactor.is_alive():
            return
        self._commits_since_compact = 0
        thread = threading.Thread(target=self._compact_quietly, name="episodelake-compact", daemon=True)
        self._compactor = thread
        with _COMPACTORS_LOCK:
            _COMPACTORS.add(thread)
        thread.start()

    def _compact_quietly(self) -> None:
        """A background compaction: its own handle on the latest version; a table removed meanwhile is no error."""
        loc = self.loc
        try:
            dt = DeltaTable(loc.delta_uri(), storage_options=loc.delta_options())
            compact_table(loc, dt, self.file_shares)
        except Exception as exc:
            if os.path.isdir(loc.child(*layout.log_parts())):  # else the dataset was removed meanwhile
                err = exc if isinstance(exc, EpisodeLakeError) else table_error(exc, loc, "background compaction")
                if err is not exc:
                    err.__cause__ = exc
                err.add_note(f"raised by the background compaction of {loc.url} (reported as a warning then)")
                self._compaction_error = err
                message = str(err).splitlines()[0] if str(err) else type(err).__name__
                warnings.warn(
                    f"background compaction of {loc.url} failed (data unchanged): {message}",
                    RuntimeWarning,
                    stacklevel=1,
                )
        finally:
            with _COMPACTORS_LOCK:
                _COMPACTORS.discard(threading.current_thread())

    @property
    def compactor(self) -> threading.Thread | None:
        """The background compaction thread last started by this handle's commits (None: none yet)."""
        return self._compactor

    def compact(self) -> None:
        """Merge small files and write a checkpoint so opening stays fast (in this thread, waiting for it).

        Raises first the failure of a background compaction this handle started
        and nothing raised yet (then it is cleared); conflicts are retried
        (:class:`CommitConflictError` when they persist), storage faults raise
        :class:`~episodelake.errors.StorageError`.
        """
        failed, self._compaction_error = self._compaction_error, None
        if failed is not None:
            raise failed
        compact_table(self.loc, self.dt, self.file_shares)
        self.dt.update_incremental()
        self._commits_since_compact = 0

    def history(self) -> list[dict[str, Any]]:
        """The commits of the log, newest first, each named for what it did (see :func:`named_commit`)."""
        try:
            return [named_commit(h) for h in self.dt.history()]
        except Exception as exc:
            raise table_error(exc, self.loc, "reading the episode table history") from exc

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

    def episode_ids_in(self, rels: Iterable[str], visible: bool = False) -> np.ndarray:
        """The ``episode_id`` column of the data files ``rels`` (relative paths), concatenated (int64).

        ``visible``: only the episodes a snapshot shows (not :data:`QUARANTINED`; files written before the
        quality columns hold none).
        """
        flagged = visible and QUARANTINED in {f.name for f in self.dt.schema().fields}
        parts = []
        for rel in sorted(rels):
            path = self.file_path(rel)
            if flagged:
                try:
                    tbl = read_table_file(self.loc, path, ["episode_id", QUARANTINED])
                except pa.ArrowInvalid:  # a file written before the quality columns: no episode of it is quarantined
                    pass
                else:
                    held = np.asarray(tbl.column(1).fill_null(False), dtype=bool)
                    parts.append(np.asarray(tbl.column(0), dtype=np.int64)[~held])
                    continue
            parts.append(np.asarray(read_table_file(self.loc, path, ["episode_id"]).column(0), dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def file_path(self, rel: str) -> str:
        """Filesystem path of a data file named relative to the table directory (as the log names it)."""
        return self.loc.child(*layout.table_parts(rel))

    def stored_files(self) -> dict[str, int]:
        """Every Parquet data file on storage, referenced or not (log checkpoints excluded): path -> bytes."""
        return stored_files(self.loc)

    def vacuum(self, retention_hours: float, dry_run: bool) -> list[str]:
        """Delete the table's data files no kept version references (see :func:`vacuum_table_files`).

        Returns their paths (sorted). ``dry_run`` deletes nothing. The handle
        moves to the latest version afterwards (unless ``dry_run``).
        """
        doomed = vacuum_table_files(self.loc, layout.table_parts(), retention_hours, dry_run)
        if not dry_run:
            table_cache.prune(self.loc, UNREFERENCED_FLOOR_HOURS * 3600.0)  # the entries of the files gone with them
            self.refresh()
        return doomed


def stored_files(loc: Location, parts: tuple[str, ...] = layout.table_parts()) -> dict[str, int]:
    """The Parquet data files under the Delta table directory ``parts`` of ``loc`` (its log excluded), path -> bytes."""
    return {path: size for path, (size, _) in _stored_files(loc, parts).items()}


def _stored_files(loc: Location, parts: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """Like :func:`stored_files`, path -> (bytes, modification time)."""
    root = loc.child(*parts)
    log = loc.child(*parts, layout.LOG) + "/"
    found = loc.fs.find(root, detail=True) if loc.fs.exists(root) else {}
    return {
        path: (int(info["size"]), file_mtime(info))
        for path, info in found.items()
        if path.endswith(layout.DATA_SUFFIX) and not path.startswith(log)
    }


def latest_file_paths(loc: Location) -> list[str]:
    """Filesystem paths of the data files of the episode table's latest version, read now."""
    try:
        dt = DeltaTable(loc.delta_uri(), storage_options=loc.delta_options())
        return [uri.split("://", 1)[-1] for uri in dt.file_uris()]
    except Exception as exc:
        raise table_error(exc, loc, "reading the episode table") from exc


def file_mtime(info: dict[str, Any]) -> float:
    """Modification time (epoch seconds) of an fsspec ``info`` entry; one without a time counts as written now."""
    stamp = info.get("mtime", info.get("LastModified", info.get("updated", info.get("created"))))
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if isinstance(stamp, str):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return float(stamp) if stamp else time.time()  # undated: never old enough to delete


def vacuum_table_files(loc: Location, parts: tuple[str, ...], retention_hours: float, dry_run: bool) -> list[str]:
    """Delete the data files of the Delta table at ``parts`` that no kept version references; their paths, sorted.

    Works on the latest version, read now (never a pinned handle: a file
    committed after it would look unreferenced). Two kinds of files go:

    * files the log removed (compaction, delete, eviction) longer than
      ``retention_hours`` ago: versions superseded before then lose them
      (deltalake's vacuum, logged as ``VACUUM START``/``VACUUM END``);
    * files the log never named (a crash leftover, or a commit in flight:
      written, not committed yet), once older than ``retention_hours`` *and*
      :data:`UNREFERENCED_FLOOR_HOURS`, whatever retention is asked for.

    A file the latest version references is never removed, and neither is
    one whose name the log mentions at all (names are unique: a UUID each;
    compared by name, so percent-encoded partition directories cannot hide
    a reference). The caller checks ``retention_hours`` against
    :data:`MIN_RETENTION_HOURS`.
    """
    uri = loc.child_url(*parts)
    delay = 0.01
    for n in range(COMMIT_RETRIES):
        try:
            return _vacuum_once(loc, parts, retention_hours, dry_run)
        except CommitFailedError as exc:  # its VACUUM START/END entry lost a race: plan again on the new version
            if n == COMMIT_RETRIES - 1:
                raise CommitConflictError(
                    f"vacuum of {uri} conflicted {COMMIT_RETRIES} times with concurrent commits: {exc}"
                ) from exc
        time.sleep(delay)  # back off before retrying a lost optimistic-concurrency race
        delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _table_to_vacuum(loc: Location, uri: str) -> DeltaTable | None:
    """The Delta table at ``uri`` for a vacuum; None when there is none (nothing to vacuum)."""
    try:
        return DeltaTable(uri, storage_options=loc.delta_options())
    except TableNotFoundError:
        return None
    except Exception as exc:
        raise table_error(exc, loc, f"vacuum of {uri}") from exc


def _vacuum_once(loc: Location, parts: tuple[str, ...], retention_hours: float, dry_run: bool) -> list[str]:
    """One attempt of :func:`vacuum_table_files` (CommitFailedError when its log entry conflicts)."""
    uri = loc.child_url(*parts)
    dt = _table_to_vacuum(loc, uri)
    if dt is None:
        return []
    now = time.time()
    hours = math.ceil(retention_hours) if retention_hours > 0 else 0
    try:
        removed = {_name(p) for p in dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)}
        live = {_name(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
        expired = {_name(p) for p in dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False)}
        # listed after the version was read: a file committed since is in it or younger than the floor
        on_disk = _stored_files(loc, parts)
        if expired and not dry_run:
            props = CommitProperties(custom_metadata={OPERATION_KEY: "VACUUM"})
            done = dt.vacuum(
                retention_hours=hours, dry_run=False, enforce_retention_duration=False, commit_properties=props
            )
            expired |= {_name(p) for p in done}
    except CommitFailedError:
        raise
    except Exception as exc:
        raise table_error(exc, loc, f"vacuum of {uri}") from exc
    cutoff = now - max(retention_hours, UNREFERENCED_FLOOR_HOURS) * 3600.0
    out = []
    for path, (_, mtime) in on_disk.items():
        name = _name(path)
        if name in live:
            continue
        if name in expired:
            out.append(path)  # removed by deltalake's vacuum above (unless dry_run)
        elif name not in removed and mtime < cutoff:
            out.append(path)
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):  # a concurrent vacuum removed it first
                    loc.fs.rm(path)
    return sorted(out)


def vacuum_table_window(loc: Location, parts: tuple[str, ...], keep_versions: int, dry_run: bool) -> list[str]:
    """Delete the data files of the Delta table at ``parts`` that none of its last ``keep_versions`` versions
    references; their paths, sorted (the automatic vacuum of a capacity dataset, docs/replay.md "Disk use").

    Works on the latest version ``L``, read now. A file the log removed at
    version ``r`` was last referenced by version ``r - 1``: it goes once
    ``r - 1 < L - keep_versions + 1``, whatever the time (versions older than
    the window lose it: time travel to them and readers pinned to them fail
    with an error, never read other data, since file names are never
    reused). Removals are read from the log entries on storage and from the
    version's own tombstones. Files the log never named (a commit in flight, a
    crash leftover) go only once older than :data:`UNREFERENCED_FLOOR_HOURS`,
    as in :func:`vacuum_table_files`. The log itself is not written (no
    ``VACUUM`` entries: the window counts the episodes' versions only).
    """
    uri = loc.child_url(*parts)
    dt = _table_to_vacuum(loc, uri)
    if dt is None:
        return []
    now = time.time()
    latest = dt.version()
    oldest_kept = latest - keep_versions + 1  # the oldest version whose files stay
    try:
        tombstones = {_name(p) for p in dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)}
        live = {_name(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
        removed_at = _removals(loc, parts, latest)
        on_disk = _stored_files(loc, parts)  # listed after the version was read (see vacuum_table_files)
    except Exception as exc:
        raise table_error(exc, loc, f"vacuum of {uri}") from exc
    kept = {name for name, version in removed_at.items() if version - 1 >= oldest_kept}
    named = tombstones | set(removed_at)
    cutoff = now - UNREFERENCED_FLOOR_HOURS * 3600.0
    out = []
    for path, (_, mtime) in on_disk.items():
        name = _name(path)
        if name in live or name in kept:
            continue
        if name in named or mtime < cutoff:
            out.append(path)
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):  # a concurrent vacuum removed it first
                    loc.fs.rm(path)
    return sorted(out)


def _removals(loc: Location, parts: tuple[str, ...], latest: int) -> dict[str, int]:
    """File name -> the version whose log entry removed it, over the entries on storage up to ``latest``."""
    out: dict[str, int] = {}
    for path in sorted(loc.fs.glob(loc.child(*parts, layout.LOG, layout.LOG_ENTRY_PATTERN))):
        try:
            version = int(_name(path).split(".", 1)[0])
        except ValueError:
            continue
        if version > latest:
            continue
        try:
            text = loc.fs.cat_file(path).decode()
        except FileNotFoundError:
            continue  # trimmed meanwhile: its removals went with the files of versions before the window
        for line in text.splitlines():
            if '"remove"' in line:
                action = json.loads(line).get("remove")
                if action and "path" in action:
                    out[_name(str(action["path"]))] = version
    return out


def trim_log(loc: Location, parts: tuple[str, ...], keep_from: int, dry_run: bool = False) -> list[str]:
    """Delete the log entries and checkpoints of the Delta table at ``parts`` before its newest checkpoint at or
    before version ``keep_from``; their paths, sorted.

    Every version from that checkpoint on stays readable (a table is read from
    a checkpoint and the entries after it; a handle on an older version
    moving to the latest reads the newest checkpoint instead), and so do
    ``history()`` entries from it on. Nothing is removed without such a
    checkpoint.
    """
    log = loc.child(*parts, layout.LOG)
    checkpoints: dict[str, int] = {}
    for path in loc.fs.glob(f"{log}/{layout.CHECKPOINT_PATTERN}"):
        with contextlib.suppress(ValueError):
            checkpoints[path] = int(_name(path).split(".", 1)[0])
    base = max((v for v in checkpoints.values() if v <= keep_from), default=None)
    if base is None:
        return []
    doomed = [p for p, v in checkpoints.items() if v < base]
    for path in loc.fs.glob(f"{log}/{layout.LOG_ENTRY_PATTERN}"):
        with contextlib.suppress(ValueError):
            if int(_name(path).split(".", 1)[0]) < base:
                doomed.append(path)
    if not dry_run:
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):
                loc.fs.rm(path)
    return sorted(doomed)


def _log_kept(loc: Location) -> bool:
    """Whether the episode table's log holds a checkpoint (so its latest version opens)."""
    try:
        return bool(loc.fs.glob(loc.child(*layout.log_parts(), layout.CHECKPOINT_PATTERN)))
    except Exception:
        return False


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


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


# Compacted files keep the codec commits write (Snappy), not optimize's default zstd: on the statistics
# columns (float64 lists, near-incompressible) zstd saved 6% of their bytes and doubled their decode, the
# floor of a view's first stats() (bench_query.py).
COMPACTED = WriterProperties(compression="SNAPPY")


def _table_bytes(dt: DeltaTable) -> int:
    """The bytes of the table files of ``dt``'s version."""
    return int(pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_numpy().sum())


def compact_table(loc: Location, dt: DeltaTable, shares: int = 1) -> None:
    """Merge small files of the latest version and write a checkpoint, through the handle ``dt``.

    With ``shares`` > 1 (capacity datasets) merged files stay below
    1/``shares`` of the table's bytes, so that an eviction, which rewrites
    the file holding the oldest episodes, rewrites a small file.

    deltalake lets two compactions of the same files both commit (their
    removes carry dataChange=false, which its conflict checker accepts),
    and every row the two share is then duplicated. So a compaction
    starts from the latest version and, on local disk, holds an exclusive
    lock file; a compaction that finds it held is skipped (nothing changes).
    A compaction that loses a race with a commit (a delete or eviction
    removed a file it rewrote) starts again from the new latest version,
    up to :data:`COMMIT_RETRIES` times, then raises
    :class:`CommitConflictError`; storage faults raise
    :class:`~episodelake.errors.StorageError`. History names it ``COMPACT``.
    """
    if not _lock_compaction(loc):
        return
    try:
        delay = 0.01
        for n in range(COMMIT_RETRIES):
            try:
                dt.update_incremental()
                target = None if shares == 1 else max(MIN_FILE_BYTES, _table_bytes(dt) // shares)
                props = CommitProperties(custom_metadata={OPERATION_KEY: "COMPACT"})
                dt.optimize.compact(target_size=target, writer_properties=COMPACTED, commit_properties=props)
                break
            except CommitFailedError as exc:
                if n == COMMIT_RETRIES - 1:
                    raise CommitConflictError(
                        f"compaction of {loc.url} conflicted {COMMIT_RETRIES} times with concurrent commits: {exc}"
                    ) from exc
            except Exception as exc:
                err = table_error(exc, loc, "compaction")
                read = dt.version()
                dt.update_incremental()
                if not isinstance(err, CorruptionError) or dt.version() == read or n == COMMIT_RETRIES - 1:
                    raise err from exc
                # a file of the version it read went meanwhile (see EpisodeTable._commit): try the new one
            time.sleep(delay)  # back off before retrying a lost optimistic-concurrency race
            delay = min(delay * 2, 1.0)
        dt.create_checkpoint()
    except EpisodeLakeError:
        raise
    except Exception as exc:
        raise table_error(exc, loc, "compaction") from exc
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
            pass
        except OSError as exc:  # a read-only mount (EROFS), a full disk, no permission: like every other write
            err = storage_fault(exc, dataset=loc.url, object=path, doing="compaction (taking its lock)")
            if err is None:
                raise
            raise err from exc
        try:
            if time.time() - os.path.getmtime(path) < COMPACT_LOCK_STALE_S:
                return False
            os.remove(path)  # left by a compactor that was killed
        except FileNotFoundError:
            pass
    return False


def _fitted(dt: DeltaTable, rows: pa.Table) -> pa.Table:
    """``rows`` with a NULL column for each column of the table they lack (the quality columns of a table that
    has them, for rows built without: deletes, edits)."""
    missing = [f for f in pa.schema(dt.schema().to_arrow()) if f.name not in rows.schema.names]
    for f in missing:
        rows = rows.append_column(f, pa.nulls(len(rows), f.type))
    return rows


def _merged(dt: DeltaTable, rows: pa.Table) -> Literal["merge"] | None:
    """``"merge"`` when ``rows`` have columns the table lacks: the quality columns (``rows.QUALITY_COLUMNS``)
    join a table with its first commit that needs them (older rows read NULL there)."""
    return None if set(rows.schema.names) <= {f.name for f in dt.schema().fields} else "merge"


def _props(operation: str, token: str | None, added: int, removed: int) -> CommitProperties:
    """Commit properties of an episodelake commit: its name and counts for history, its token; no deltalake retries."""
    meta = {OPERATION_KEY: operation, ADDED_KEY: str(added), REMOVED_KEY: str(removed)}
    if token is not None:
        meta[TOKEN_KEY] = token
    return CommitProperties(custom_metadata=meta, max_commit_retries=0)


def rows_token(rows: pa.Table) -> str:
    """A token for the commit of ``rows``, the same for every attempt to commit them (episode ids are unique)."""
    if not len(rows):
        return uuid.uuid4().hex
    ids = rows["episode_id"]
    return f"{ids[0].as_py()}:{ids[len(ids) - 1].as_py()}:{len(rows)}"


_DELTA_NAMES = {"OPTIMIZE": "COMPACT", "CREATE TABLE": "CREATE", "SET TBLPROPERTIES": "SET PROPERTIES"}


def named_commit(entry: dict[str, Any]) -> dict[str, Any]:
    """A history entry with ``operation`` naming what episodelake did, Delta's name kept as ``delta_operation``.

    Names: ``CREATE``, ``APPEND``, ``EVICT`` (episodes added, the oldest
    removed to fit the capacity), ``DELETE``, ``CLEAR``, ``TRIM``, ``SPLIT``,
    ``SET META`` (edits: the edited episodes' rows replaced), ``DROP FIELDS``,
    ``RENAME FIELD`` (schema edits: every row rewritten), ``COMPACT``,
    ``VACUUM START``/``VACUUM END``, ``ADD COLUMN`` and ``UPDATE`` (derived
    columns). ``episodes_added``/``episodes_removed`` count the episodes
    (None where the commit does not record them: commits of episodelake
    0.2 and older, named from Delta's operation).
    """
    out = dict(entry)
    delta = entry.get("operation")
    name = entry.get(OPERATION_KEY)
    params = entry.get("operationParameters") or {}
    if name is None or name == "VACUUM":
        if delta == "WRITE" and params.get("mode") == "Overwrite":
            name = "DELETE" if params.get("predicate") else "CLEAR"
        elif delta == "WRITE":
            name = "APPEND"
        else:
            name = _DELTA_NAMES.get(str(delta), delta)
    out["delta_operation"] = delta
    out["operation"] = name
    for key, counted in ((ADDED_KEY, "episodes_added"), (REMOVED_KEY, "episodes_removed")):
        value = entry.get(key)
        out[counted] = int(value) if value is not None else None
    if out["episodes_added"] is None and name == "APPEND":
        out["episodes_added"] = (entry.get("operationMetrics") or {}).get("num_added_rows")
    return out


def table_error(exc: BaseException, loc: Location, doing: str) -> EpisodeLakeError:
    """The episodelake error for a raw deltalake/Arrow/OS failure of ``doing`` on ``loc``'s tables.

    A storage fault is a :class:`~episodelake.errors.StorageError`; anything
    else deltalake reports about the table (a file or log entry it cannot
    read or parse) is a :class:`CorruptionError` naming the table.
    """
    if isinstance(exc, EpisodeLakeError):
        return exc
    err = storage_fault(exc, dataset=loc.url, object=loc.delta_uri(), doing=doing, endpoint=loc.endpoint)
    if err is not None:
        return err
    if isinstance(exc, DeltaError | OSError | pa.ArrowException):
        return CorruptionError(f"{doing} failed at {loc.url}: the table cannot be read ({type(exc).__name__}: {exc})")
    raise exc


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


lifecycle.on_exit("compactions", join_compactions)  # after the exit commit, which may start one
