"""SQL over episodes: DuckDB views of a snapshot, where(), select_episodes() and stats().

Every query runs in an in-process DuckDB cursor that sees two views, defined by
the ``.sql`` files shipped in ``episodelake/sql/``:

* ``episodes``: the snapshot's Delta table as an Arrow dataset (projection and
  filter pushdown, hive partition pruning), left-joined on ``episode_id``
  with the snapshot's derived columns (:mod:`derived`; NULL where never set). Storage encodings show through:
  uint8/16/32 are widened to the next signed int (values are true), uint64 is
  bit-reinterpreted as int64, float16 is widened to float32 and complex values
  have a trailing ``[re, im]`` axis.
* ``steps``: one row per transition (``episode_id``, ``t``, per-transition
  ``terminated``/``truncated`` and every small per-step field; an observation
  field ``<key>`` at row ``t`` and ``next_<key>`` at row ``t + 1``).

For a :class:`~episodelake.dataset.DatasetView` both views hold only the view's
episodes. Each query gets its own cursor, so a returned :class:`SQLResult` stays
valid (and lazy) however many queries follow it.

Errors: every DuckDB error becomes an episodelake error. The user's SQL being
wrong (it does not parse or bind, or a sandboxed query reaches outside the
dataset) is a :class:`~episodelake.errors.QueryError`; a scan of the table
files that fails is a :class:`~episodelake.errors.StorageError` when the storage
failed (:func:`~episodelake.faults.storage_fault`), else a
:class:`~episodelake.errors.CorruptionError` naming the damaged file. The first
query of a snapshot checks that every table file its log references exists with
the logged size (one listing, no file is opened, so partition pruning is kept).
A file that is gone because a later version rewrote the table (compaction,
delete, eviction) and vacuum removed it is not damage: a :class:`Dataset`
following the latest version moves to it (as ``refresh()`` would) and answers
from there; a view or a pinned version raises a CorruptionError saying so.

Sandbox: ``where()``, ``select_episodes()``, ``el.Weighted``/``el.Prioritized`` SQL and
``sql(..., sandbox=True)`` run in a second in-process database opened with
``enable_external_access = false`` (no file, URL, extension or Python-variable
access: only the registered views) and its configuration locked; sandboxed SQL
is also limited to one ``SELECT`` statement. A refusal is a QueryError.

``where()`` runs first over the snapshot's index columns, already in memory
from its one index scan (:meth:`Snapshot.scan`); a predicate that needs other
columns (per-step lists, statistics) runs over ``episodes`` instead. A
dataset's first ``where()`` before that scan runs over ``episodes`` too
(partitions pruned, only the columns it names read) and places its rows by
their order keys (:meth:`Snapshot.order_keys`: two columns), so it does not
wait for the scan of every index column; the next read that needs the index
makes the scan.

Statistics come from the per-episode mergeable statistics
(``stats/<key>/{count,sum,sumsq,min,max}``) written at commit time, read
once per snapshot, per field, and only from the table files that hold the
collection's episodes, into a :class:`~episodelake.stats.StatsTable`; a
subset's statistics are then one NumPy gather and reduction over its rows,
never a pass over steps or tensors.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core import lifecycle
from ..core.errors import ArgumentError, CorruptionError, EpisodeLakeError, QueryError
from ..core.schema import FieldSpec
from ..core.stats import STAT_PARTS, StatsTable, stat_column, stat_fields, value_moments, values_moments
from ..storage.faults import storage_fault
from ..storage.sql import REFUSED, check_sandboxed, connect, limited, quote, sql_template, steps_columns
from ..storage.table import EpisodeTable
from .collection import EpisodeCollection, subset
from .snapshot import Snapshot

POSITION = "__position"  # the in-memory index table's column of snapshot positions
# How DuckDB reports a failed scan of a registered Arrow stream (2.x names the stream, 1.5 its scan function):
# the table files failed, not the SQL (the other registered streams are in memory)
SCANS = ("'episode_table'", "arrow_scan: get_next failed")
REPLANS = 3  # moves to a newer version when another process keeps rewriting the table under a query
T = TypeVar("T")


def query_failure(exc: duckdb.Error, what: str) -> QueryError:
    """The QueryError of a query DuckDB refused (``what`` names it), a sandbox refusal said as such."""
    if isinstance(exc, duckdb.PermissionException):
        return QueryError(f"{what}: {REFUSED}: {exc}")
    return QueryError(f"{what}: {exc}")


class _SnapshotSQL:
    """Per-snapshot state: DuckDB connections, the in-memory index table and the statistics table."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self._connections: dict[bool, duckdb.DuckDBPyConnection] = {}  # sandboxed or not -> cursor
        self._connecting = threading.Lock()  # not self.lock: a query may connect while a scan holds that
        self.lock = threading.Lock()
        self._stats: StatsTable | None = None
        self._index: pa.Table | None = None
        self._episode_values: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._whole_moments: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._stats_files: dict[str, np.ndarray] = {}  # field key -> which table files are in _stats
        self._files_checked = False
        self.where_unscanned = False  # whether a where() ran before the index scan (a later one makes it)

    def connection(self, sandbox: bool) -> duckdb.DuckDBPyConnection:
        """This snapshot's cursor of the process's database (or of its sandboxed twin), made on first use.

        Lazily: the first query of a process opens only the database it runs
        in (an open costs 15-50 ms; where() needs the sandbox alone).
        """
        with self._connecting:
            cur = self._connections.get(sandbox)
            if cur is None:
                cur = self._connections[sandbox] = database(sandbox).cursor()
            return cur

    def close(self) -> None:
        """Close the cursors made so far."""
        with self._connecting:
            for cur in self._connections.values():
                cur.close()

    def check_files(self, again: bool = False) -> None:
        """Every table file exists with the size its log entry records, else CorruptionError naming it.

        Once per snapshot unless ``again``. A listing, not a read: partition
        pruning still decides which files a query opens. A file gone because a
        later version rewrote the table says so (:func:`rewritten`); a listing
        the storage refuses is a StorageError.
        """
        with self.lock:
            if self._files_checked and not again:
                return
            snap = self.snap
            try:
                table = EpisodeTable.open(snap.loc, snap.version)
                listed = table.stored_files()
            except (OSError, EpisodeLakeError) as exc:
                doing = f"listing the table files of version {snap.version}"
                fault = storage_fault(exc, dataset=snap.loc.url, doing=doing)
                if fault is not None:
                    raise fault from exc
                raise
            for add in table.add_actions():
                path, size = table.file_path(add["path"]), add["size_bytes"]
                found = listed.get(path)
                if found is None:
                    raise CorruptionError(
                        rewritten(snap) or f"{snap.loc.url} version {snap.version}: table file {path} is missing"
                    )
                if found != size:
                    raise CorruptionError(
                        f"{snap.loc.url} version {snap.version}: table file {path} has {found} bytes, "
                        f"its log entry says {size} (truncated or overwritten)"
                    )
            self._files_checked = True

    def failure(self, exc: duckdb.Error, what: str) -> EpisodeLakeError:
        """The episodelake error for DuckDB error ``exc`` of a query (``what`` names it).

        A failed scan of the table files is a StorageError when storage failed,
        else a CorruptionError naming the damaged file; anything else is the
        query's fault (QueryError), a sandbox refusal included.
        """
        if not any(scan in str(exc) for scan in SCANS):
            return query_failure(exc, what)
        self.check_files(again=True)  # Arrow caches footers, so list again rather than re-read to find the file
        return self.snap.unreadable(None, exc)  # a storage fault, else the damaged file named

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Snapshot position of each id, in the given order; unknown ids raise :class:`QueryError`."""
        try:
            return self.snap.positions_of(ids)
        except KeyError as exc:
            raise QueryError(exc.args[0]) from None

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """Snapshot positions of ``ids`` without duplicates, in episode order."""
        hit = np.zeros(self.snap.num_episodes, dtype=bool)
        hit[self.lookup(ids)] = True
        return np.flatnonzero(hit)

    def index_table(self, positions: np.ndarray | None) -> pa.Table:
        """The index columns of the snapshot (or of ``positions`` only) with each row's :data:`POSITION`."""
        scan = self.snap.scan()
        if positions is not None:
            return scan.table.take(pa.array(scan.order[positions])).append_column(POSITION, pa.array(positions))
        with self.lock:
            if self._index is None:
                position = np.empty_like(scan.order)
                position[scan.order] = np.arange(len(position))
                self._index = scan.table.append_column(POSITION, pa.array(position))
            return self._index

    def episode_values(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(length, return, whether the return is set) per scan row, as NumPy (a NULL return is skipped by stats)."""
        with self.lock:
            if self._episode_values is None:
                table = self.snap.scan().table
                returns = table.column("return").combine_chunks()
                self._episode_values = (  # views of the combined Arrow buffers, no second copy
                    table.column("length").combine_chunks().to_numpy(zero_copy_only=False),
                    returns.to_numpy(zero_copy_only=False),
                    returns.is_valid().to_numpy(zero_copy_only=False),
                )
            return self._episode_values

    def episode_moments(self, rows: np.ndarray | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Moments of episode length and of the returns set, over scan ``rows`` (None: every row).

        Every row's are computed once per snapshot (four passes over each column
        were most of a whole-dataset stats() at 1M episodes); each call gets its own dicts.
        """
        out = self._whole_moments if rows is None else None
        if out is None:
            length, returns, has_return = self.episode_values()
            if rows is not None:  # a subset gathers its rows; the whole table takes the arrays as they are
                length, returns, has_return = length[rows], returns[rows], has_return[rows]
            out = value_moments(length), value_moments(returns[has_return])
            if rows is None:
                self._whole_moments = out
        return dict(out[0]), dict(out[1])

    def stats_table(self, fields: list[FieldSpec], rows: np.ndarray) -> StatsTable:
        """The statistics table, holding ``fields`` at least for the scan ``rows``.

        Reads the statistics columns of the fields still missing there, once,
        from the table files holding ``rows`` only (partitions a collection
        does not touch are never read).
        """
        with self.lock:
            scan = self.snap.scan()
            if self._stats is None:
                self._stats = StatsTable(scan.file, len(scan.fragments))
            needed = np.zeros(len(scan.fragments), dtype=bool)
            needed[scan.file if len(rows) == scan.table.num_rows else scan.file[rows]] = True  # rows are distinct
            done = {f.key: self._stats_files.setdefault(f.key, np.zeros(len(needed), dtype=bool)) for f in fields}
            todo = [f for f in fields if (needed & ~done[f.key]).any()]
            if todo:
                files = np.flatnonzero(np.logical_or.reduce([needed & ~done[f.key] for f in todo]))
                columns = [stat_column(f, p) for f in todo for p in STAT_PARTS]
                for rows_read, piece in self.snap.read_stats(columns, files):
                    for f in todo:
                        self._stats.fill(f, rows_read, piece)
                for f in todo:
                    done[f.key][files] = True
            return self._stats


_STATE: weakref.WeakKeyDictionary[Snapshot, _SnapshotSQL] = weakref.WeakKeyDictionary()
_STATE_LOCK = threading.Lock()
_DBS: dict[bool, tuple[int, duckdb.DuckDBPyConnection]] = {}  # sandboxed or not -> (pid, database)
_DB_LOCK = threading.Lock()  # not _STATE_LOCK: opening a database (15-50 ms) need not hold up making states


def database(sandbox: bool = False) -> duckdb.DuckDBPyConnection:
    """The process's in-memory DuckDB database (or its sandboxed twin); snapshots and queries get connections to it.

    One database, not one per snapshot: opening a database costs 15-50 ms, a
    connection microseconds, and a new snapshot per commit is a learner's
    refresh. Temporary views and registered tables are per connection.
    """
    with _DB_LOCK:
        db = _DBS.get(sandbox)
        if db is None or db[0] != os.getpid():  # a forked process opens its own
            db = _DBS[sandbox] = (os.getpid(), connect(sandbox))
        return db[1]


def _close_databases_at_exit() -> None:
    """Close every DuckDB connection and the database before the interpreter tears down (its threads with it)."""
    with _STATE_LOCK:
        states = list(_STATE.values())
    with _DB_LOCK:
        dbs = list(_DBS.values())
    for st in states:
        st.close()
    for pid, con in dbs:
        if pid == os.getpid():
            con.close()


lifecycle.on_exit("databases", _close_databases_at_exit)


def _state(snap: Snapshot) -> _SnapshotSQL:
    with _STATE_LOCK:
        st = _STATE.get(snap)
        if st is None:
            st = _STATE[snap] = _SnapshotSQL(snap)
        return st


def rewritten(snap: Snapshot) -> str | None:
    """Why ``snap``'s table files are gone when a later version rewrote the table and vacuum removed them, else None.

    That is no damage: compaction, a delete or an eviction replaced the files
    in a newer version, and a vacuum (another process's, typically) deleted
    the old ones. The diagnosis lists the log and storage only; where it
    cannot, the caller's own error stands (None).
    """
    try:
        latest = EpisodeTable.open(snap.loc)
        if latest.version <= snap.version:
            return None
        pinned = EpisodeTable.open(snap.loc, snap.version)
        listed = pinned.stored_files()
        gone = sorted(pinned.file_path(p) for p in pinned.file_set() - latest.file_set())
    except (OSError, EpisodeLakeError):
        return None
    gone = [p for p in gone if p not in listed]
    if not gone:
        return None
    more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
    return (
        f"{snap.loc.url} version {snap.version}: table file {gone[0]}{more} was removed: a later version "
        f"(latest {latest.version}) rewrote the table (compaction, delete or eviction) and a vacuum deleted the "
        f"old files, so version {snap.version} can no longer be read; refresh() the dataset or open a newer version"
    )


def _follows(collection: EpisodeCollection, snap: Snapshot) -> bool:
    """Move a Dataset following the latest version past ``snap``; whether it moved (views and pins never do)."""
    refresh = getattr(collection, "refresh", None)  # a view has none: it stays on its snapshot
    if refresh is None:
        return False
    refresh()
    return collection.snapshot().version != snap.version


def answer(collection: EpisodeCollection, body: Callable[[Snapshot], T], first: Snapshot | None = None) -> T:
    """``body(snapshot)``, re-planned on a newer version while another process's rewrite removed the files it read.

    ``first``: the snapshot of the first try (default: the collection's). A
    CorruptionError that :func:`rewritten` explains is retried on the version
    a following Dataset moves to (at most :data:`REPLANS` times); otherwise
    it is raised with that explanation.
    """
    snap = first or collection.snapshot()
    for attempt in range(REPLANS + 1):
        try:
            return body(snap)
        except CorruptionError as exc:
            why = rewritten(snap)
            if why is None:
                raise
            if attempt == REPLANS or not _follows(collection, snap):
                raise CorruptionError(why) from exc
        snap = collection.snapshot()
    raise AssertionError("unreachable: the last attempt returns or raises")


def _cursor(
    snap: Snapshot, ids: np.ndarray | None, sandbox: bool, used: str | None = None
) -> duckdb.DuckDBPyConnection:
    """A fresh DuckDB cursor with the ``episodes`` and ``steps`` views of ``snap`` (only ``ids``, when given).

    ``used``: ``steps`` holds only the columns this SQL text names (:func:`steps_columns`).
    """
    state = _state(snap)
    state.check_files()
    cur = state.connection(sandbox).cursor()
    cur.register("episode_table", snap.visible_dataset())
    restriction = derived = join = ""
    if snap.derived.fields:
        cur.register("derived_table", snap.derived_values())
        derived = "".join(f", derived_table.{quote(f.key)}" for f in snap.derived.fields)
        join = "LEFT JOIN derived_table USING (episode_id)"
    if ids is not None:
        cur.register("view_ids", pa.table({"episode_id": pa.array(ids, pa.int64())}))
        restriction = "SEMI JOIN view_ids USING (episode_id)"
    cur.execute(sql_template("episodes").substitute(derived=derived, join=join, restriction=restriction))
    unnest, columns = steps_columns(snap.schema, used)
    cur.execute(sql_template("steps").substitute(unnest=unnest, columns=columns))
    return cur


def _view_ids(collection: EpisodeCollection, snap: Snapshot) -> np.ndarray | None:
    """The episode ids the views of ``snap`` keep for ``collection`` (None: every episode)."""
    chosen = subset(collection, snap)
    return None if chosen is None else snap.order_keys()[1][chosen]  # the ids, without the index scan


class Views(Protocol):
    """Where a query's ``episodes`` and ``steps`` views come from: one collection's snapshot, or a concat's stack."""

    def cursor(self, sandbox: bool) -> duckdb.DuckDBPyConnection:
        """A fresh DuckDB cursor holding both views (in the sandboxed database if asked)."""
        ...

    def failure(self, exc: duckdb.Error, what: str) -> EpisodeLakeError:
        """The episodelake error for DuckDB's ``exc`` of a query ``what`` names."""
        ...

    def answer(self, body: Callable[[Views], T]) -> T:
        """``body(views)``, retried on newer views while a rewrite removed the files it read (see :func:`answer`)."""
        ...


class SnapshotViews:
    """The views of ``collection``'s episodes in ``snap`` (only theirs when it is a subset, or only ``positions``').

    ``used``: the SQL text of the only query these views serve; ``steps`` then
    holds only the columns it names (see :func:`steps_columns`).
    """

    def __init__(
        self,
        collection: EpisodeCollection,
        snap: Snapshot,
        positions: np.ndarray | None = None,
        used: str | None = None,
    ) -> None:
        self.collection, self.snap, self.used = collection, snap, used
        if positions is not None and len(positions) < snap.num_episodes:
            self.ids: np.ndarray | None = snap.index["episode_id"][positions]
        else:
            self.ids = _view_ids(collection, snap) if positions is None else None

    def cursor(self, sandbox: bool) -> duckdb.DuckDBPyConnection:
        return _cursor(self.snap, self.ids, sandbox, self.used)

    def failure(self, exc: duckdb.Error, what: str) -> EpisodeLakeError:
        return _state(self.snap).failure(exc, what)

    def answer(self, body: Callable[[Views], T]) -> T:
        def on(snap: Snapshot) -> T:
            return body(self if snap is self.snap else SnapshotViews(self.collection, snap))

        return answer(self.collection, on, self.snap)


ROW_STATEMENTS = ("SELECT", "EXPLAIN")  # statements that only read: their result is lazy and may run again


def _has_rows(query: Any, what: str, sandbox: bool) -> bool:
    """Whether ``query``, one SQL statement, is a query (SELECT, EXPLAIN) rather than a command; else QueryError.

    Sandboxed SQL must be one SELECT.
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError(f"{what} needs a non-empty SQL string, got {query!r}")
    try:
        kinds = [str(st.type).rsplit(".", 1)[-1] for st in duckdb.extract_statements(query)]
    except duckdb.Error as exc:
        raise QueryError(f"SQL error in {query!r}: {exc}") from exc
    if sandbox and kinds != ["SELECT"]:
        raise QueryError(
            f"{what}: sandboxed SQL must be exactly one SELECT statement, got {', '.join(kinds) or 'none'} in {query!r}"
        )
    if len(kinds) != 1:
        raise QueryError(f"{what} takes one SQL statement per call, got {len(kinds)} in {query!r}")
    if sandbox:
        check_sandboxed(query, f"{what} {query!r}")
    return kinds[0] in ROW_STATEMENTS


class SQLResult:
    """The rows of one :func:`run_sql` query: lazy, run when fetched, the same on every supported DuckDB.

    Every fetch runs the query again over the views it was planned on,
    except :meth:`fetchone`/:meth:`fetchmany`, which read on through one run
    (a fetch that returns fewer rows than asked, or :meth:`fetchall`, ends
    it). Errors are episodelake's (see the module docstring): a fetch whose
    table files another process's rewrite removed is re-planned on the latest
    version when the query came from a Dataset following it.
    ``relation`` is DuckDB's own relation, for its relational API (its
    methods and errors are DuckDB's and vary by version).
    """

    def __init__(self, views: Views, query: str, params: Any, sandbox: bool, what: str) -> None:
        self._query, self._params = query, params
        self._sandbox, self._what = sandbox, what
        self._stream: duckdb.DuckDBPyConnection | None = None
        if sandbox:
            check_sandboxed(query, what)
        self._plan(views)

    def _plan(self, views: Views) -> None:
        """Bind the query over ``views``."""
        self._views = views
        try:
            self._cur = views.cursor(self._sandbox)
            with self._limited(self._cur):
                self._rel = self._cur.sql(self._query, params=self._params)
        except duckdb.Error as exc:
            raise views.failure(exc, self._what) from exc

    def _limited(self, cur: duckdb.DuckDBPyConnection) -> contextlib.AbstractContextManager[None]:
        """A sandboxed query's run under its time limit (:func:`limited`); trusted SQL runs unlimited."""
        return limited(cur, self._what) if self._sandbox else contextlib.nullcontext()

    @property
    def relation(self) -> duckdb.DuckDBPyRelation:
        """DuckDB's own relation of the query."""
        return self._rel

    def _fetch(self, how: Callable[[duckdb.DuckDBPyRelation], T]) -> T:
        def body(views: Views) -> T:
            if views is not self._views:
                self._plan(views)
            try:
                with self._limited(self._cur):
                    return how(self._rel)
            except duckdb.Error as exc:
                raise views.failure(exc, self._what) from exc

        return self._views.answer(body)

    def _streamed(self, how: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        views = self._views
        try:
            if self._stream is None:
                self._stream = views.cursor(self._sandbox)
                with self._limited(self._stream):
                    self._stream.execute(self._query, self._params)
            with self._limited(self._stream):
                return how(self._stream)
        except duckdb.Error as exc:
            self._end_stream()
            raise views.failure(exc, self._what) from exc

    def _end_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every row as a tuple (the rest of a run :meth:`fetchone`/:meth:`fetchmany` started)."""
        if self._stream is not None:
            rows = self._streamed(lambda cur: cur.fetchall())
            self._end_stream()
            return rows
        return self._fetch(lambda rel: rel.fetchall())

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row of the current run (a new run starts after one ended); None past the last row."""
        row = self._streamed(lambda cur: cur.fetchone())
        if row is None:
            self._end_stream()
        return row

    def fetchmany(self, size: int = 1) -> list[tuple[Any, ...]]:
        """The next ``size`` rows of the current run (fewer at its end, which ends the run)."""
        if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
            raise ArgumentError(f"fetchmany: size must be an int >= 0, got {size!r}")
        rows = self._streamed(lambda cur: cur.fetchmany(int(size)))
        if len(rows) < size:
            self._end_stream()
        return rows

    def df(self) -> Any:
        """The rows as a pandas DataFrame."""
        return self._fetch(lambda rel: rel.df())

    fetchdf = df

    def pl(self) -> Any:
        """The rows as a polars DataFrame."""
        return self._fetch(lambda rel: rel.pl())

    def fetchnumpy(self) -> dict[str, np.ndarray]:
        """The rows as NumPy columns, converted from Arrow (not DuckDB's own conversion: see :func:`column_numpy`).

        List columns of one length become extra array axes, ragged ones object
        arrays of lists; NULLs read NaN in numeric columns, None in object ones.
        """
        tbl = self.to_arrow_table()
        return {name: column_numpy(tbl.column(name)) for name in tbl.column_names}

    def to_arrow_table(self) -> pa.Table:
        """The rows as a ``pyarrow.Table``."""
        return self._fetch(lambda rel: rel.to_arrow_table())

    fetch_arrow_table = to_arrow_table

    def arrow(self, batch_size: int = 1_000_000) -> pa.RecordBatchReader:
        """The rows as a ``pyarrow.RecordBatchReader`` of up to ``batch_size`` rows a batch, streamed."""
        reader = self._fetch(lambda rel: rel.to_arrow_reader(batch_size))
        views, cur = self._views, self._cur

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                with self._limited(cur):  # the time limit covers the whole stream, from its first batch
                    yield from reader
            except (duckdb.Error, pa.ArrowException, OSError) as exc:  # DuckDB's error, through Arrow's stream
                raise views.failure(duckdb.Error(str(exc)), self._what) from exc

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    @property
    def columns(self) -> list[str]:
        """The result's column names."""
        return list(self._rel.columns)

    @property
    def types(self) -> list[str]:
        """The result's DuckDB column types, as text (``BIGINT``, ``VARCHAR[]``, ...)."""
        return [str(t) for t in self._rel.types]

    def __repr__(self) -> str:
        return self._fetch(lambda rel: repr(rel))


def run_sql(collection: EpisodeCollection, query: str, params: Any = None, sandbox: bool = False) -> SQLResult | None:
    """:func:`sql_over` the views of ``collection``'s snapshot."""
    return sql_over(SnapshotViews(collection, collection.snapshot()), query, params, sandbox)


def sql_over(views: Views, query: str, params: Any = None, sandbox: bool = False) -> SQLResult | None:
    """Run one SQL statement over ``episodes``/``steps``: a lazy :class:`SQLResult` for a query, else None.

    A query (SELECT, EXPLAIN) runs when its result is fetched; any other
    statement (COPY, CREATE, SET, ...) runs once, now, on a cursor of its own.
    ``params`` binds ``?`` or ``$name`` placeholders (a sequence or a mapping).
    ``sandbox``: one SELECT statement that reads nothing but the views.
    """
    rows = _has_rows(query, "sql()", sandbox)
    check_params(params, "sql()")
    _bound(query, params, f"SQL error in {query!r}")
    what = f"SQL error in {query!r}"
    if rows:
        return views.answer(lambda v: SQLResult(v, query, params, sandbox, what))

    def command(v: Views) -> None:
        try:
            v.cursor(sandbox).execute(query, params)
        except duckdb.Error as exc:
            raise v.failure(exc, what) from exc

    views.answer(command)
    return None


def column_numpy(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """One result column as NumPy; list columns of uniform length become extra axes, ragged ones objects."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    shape = [len(arr)]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if arr.null_count or len(lengths) == 0 or (lengths != lengths[0]).any():
            return np.array(col.to_pylist(), dtype=object)
        shape.append(int(lengths[0]))
        arr = pc.list_flatten(arr)
    return arr.to_numpy(zero_copy_only=False).reshape(shape)


def positions_in(snap: Snapshot, tbl: pa.Table, what: str) -> np.ndarray:
    """Snapshot positions (episode order, no duplicates) of the validated ``episode_id`` column of ``tbl``."""
    if "episode_id" not in tbl.column_names:
        raise QueryError(f"{what}: the query must return an episode_id column, got {tbl.column_names}")
    ids = tbl.column("episode_id")
    if not pa.types.is_integer(ids.type) or ids.null_count:
        raise QueryError(f"{what}: episode_id must be non-null integers, got {ids.type}")
    return _state(snap).positions_of(ids.to_numpy())


def check_params(params: Any, what: str) -> Any:
    """``params`` if DuckDB can bind it (None, a list/tuple of values or a mapping of names), else ArgumentError."""
    if params is None or isinstance(params, list | tuple | Mapping):
        return params
    raise ArgumentError(f"{what}: params must be a list or tuple of values or a mapping of names, got {params!r}")


def _bound(text: str, params: Any, what: str) -> None:
    """QueryError when SQL ``text`` has placeholders and ``params`` is None (DuckDB versions word it differently)."""
    if params is not None:
        return
    try:
        names = duckdb.extract_statements(text)[0].named_parameters
    except duckdb.Error as exc:
        raise QueryError(f"{what}: {exc}") from exc
    if names:
        raise QueryError(f"{what}: values for its placeholders ({len(names)}) were not provided: pass params=")


def _predicate(predicate: Any, what: str) -> str:
    """``predicate`` if it parses as exactly one SQL expression (placeholders allowed), else QueryError."""
    if not isinstance(predicate, str) or not predicate.strip():
        raise QueryError(f"{what} needs a SQL predicate string, got {predicate!r}")
    try:
        duckdb.SQLExpression(predicate)
    except duckdb.Error as exc:
        raise QueryError(f"invalid {what} predicate {predicate!r}: {exc}") from exc
    return predicate


def where_condition(predicate: Any, params: Any, caller: str = "where()") -> tuple[str, str]:
    """The error prefix and the `` WHERE (...)`` clause of a where() ``predicate`` and its ``params``, checked.

    ``predicate`` must parse as one SQL expression and ``params`` fill its
    placeholders (:class:`QueryError`/:class:`ArgumentError` otherwise);
    ``caller`` names who took the predicate in those errors.
    """
    _predicate(predicate, caller)
    check_params(params, caller)
    what = f"invalid {caller} predicate {predicate!r}"
    _bound(f"SELECT 1 WHERE ({predicate}\n)", params, what)
    check_sandboxed(f"SELECT episode_id FROM episodes WHERE (\n{predicate}\n)", what)
    # the predicate on lines of its own: a trailing -- comment cannot reach the closing parenthesis
    return what, " WHERE (\n" + predicate + "\n)"


def check_selection(query: Any, params: Any) -> str:
    """The error prefix of a select_episodes() ``query``: one SELECT whose placeholders ``params`` fill."""
    _has_rows(query, "select_episodes()", True)
    check_params(params, "select_episodes()")
    what = f"invalid select_episodes() query {query!r}"
    _bound(query, params, what)
    return what


def where(collection: EpisodeCollection, predicate: str, params: Any = None) -> tuple[Snapshot, np.ndarray]:
    """The episodes of ``collection`` for which the SQL ``predicate`` over ``episodes`` is true.

    Returns the snapshot queried and their positions in it. ``predicate`` must
    parse as one SQL expression (anything else is a :class:`QueryError`);
    ``params`` binds its ``?`` or ``$name`` placeholders (a sequence or a
    mapping), by DuckDB. It runs sandboxed (it reads nothing but the
    dataset), over the in-memory index columns when it uses only those, else
    over ``episodes``; a whole dataset's first where() before the snapshot's
    index scan runs over ``episodes`` without making it (:func:`_where_unscanned`).
    """
    what, condition = where_condition(predicate, params)

    def body(snap: Snapshot) -> tuple[Snapshot, np.ndarray]:
        state = _state(snap)
        state.check_files()
        chosen = subset(collection, snap)  # a Dataset's (None) needs no index scan
        try:
            if chosen is None and not (snap.scan_ready() or state.where_unscanned or snap.derived.fields):
                state.where_unscanned = True  # once: a dataset queried again is worth its index in memory
                return snap, _where_unscanned(snap, condition, params, what)
            cur = state.connection(sandbox=True).cursor()
            cur.register("episode_index", state.index_table(chosen))
            try:
                with limited(cur, what):
                    found = cur.sql(f"SELECT {quote(POSITION)} FROM episode_index" + condition, params=params)
                    return snap, np.sort(found.to_arrow_table().column(0).to_numpy())
            except (duckdb.BinderException, duckdb.CatalogException):  # needs more than the index: other columns
                query = "SELECT episode_id FROM episodes" + condition
                cur = _cursor(snap, _view_ids(collection, snap), True)
                with limited(cur, what):
                    tbl = cur.sql(query, params=params).to_arrow_table()
                return snap, positions_in(snap, tbl, what)
        except duckdb.Error as exc:
            raise state.failure(exc, what) from exc

    return answer(collection, body)


def _where_unscanned(snap: Snapshot, condition: str, params: Any, what: str) -> np.ndarray:
    """The positions (sorted) of every episode of ``snap`` that ``condition`` holds for, before its index scan.

    The predicate runs over ``episodes`` (the table files: partitions pruned,
    only the columns it names read) and its rows are placed by their order
    keys (:meth:`Snapshot.order_keys`, two columns): the first ``where()`` of
    a dataset does not wait for the scan of every index column.
    """
    query = "SELECT created_at, episode_id FROM episodes" + condition
    cur = _cursor(snap, None, True, used=query)
    with limited(cur, what):
        tbl = cur.sql(query, params=params).to_arrow_table()
    created = tbl.column("created_at").combine_chunks().cast(pa.int64()).to_numpy()
    try:
        return np.sort(snap.positions_of_keys(created, tbl.column("episode_id").to_numpy()))
    except KeyError as exc:
        raise QueryError(exc.args[0]) from None


def select_episodes(collection: EpisodeCollection, query: str, params: Any = None) -> tuple[Snapshot, np.ndarray]:
    """The episodes whose ``episode_id`` the SQL ``query`` returns (duplicates count once).

    Returns the snapshot queried and their positions in it. ``params`` binds the
    query's placeholders. The query runs sandboxed (one SELECT that reads
    nothing but the views). Ids outside ``collection`` raise :class:`QueryError`.
    """
    what = check_selection(query, params)

    def body(snap: Snapshot) -> tuple[Snapshot, np.ndarray]:
        result = SQLResult(SnapshotViews(collection, snap), query, params, True, what)
        positions = positions_in(snap, result.to_arrow_table(), what)
        chosen = subset(collection, snap)
        if chosen is not None:
            outside = np.setdiff1d(positions, chosen)
            if len(outside):
                bad = snap.index["episode_id"][outside][:10].tolist()
                raise QueryError(f"select_episodes(): episode ids not in this view: {bad}")
        return snap, positions

    return answer(collection, body)


def stats(collection: EpisodeCollection, fields: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Count, sum, mean, population std, min and max of per-step fields, episode length and return.

    Returns ``{"episodes": {"count": n}, "length": {...}, "return": {...}, <key>: {...}}``.
    ``length``/``return`` values are floats (``count`` an int; ``return`` counts
    episodes that have one). A field's values are per channel (the ``C`` axis
    of its layout, or the single axis of a 1-D field): ``count`` is an int
    (values per channel), the rest float64 arrays of shape ``[C]``; a field
    without channels gives floats. An empty subset gives NaN. Computed from the
    commit-time statistics of the collection's episodes; no tensor is read.
    """

    def body(snap: Snapshot) -> dict[str, dict[str, Any]]:
        specs = stat_fields(snap.schema, fields)
        scan = snap.scan()
        state = _state(snap)
        chosen = subset(collection, snap)
        positions = np.arange(snap.num_episodes) if chosen is None else chosen
        # sorted scan rows: sequential gathers (statistics of a set do not depend on its order)
        rows = np.arange(len(scan.order)) if chosen is None else np.sort(scan.order[positions])
        table = state.stats_table([f for f in specs if not f.derived], rows)
        lengths, returns = state.episode_moments(None if chosen is None else rows)
        out: dict[str, dict[str, Any]] = {"episodes": {"count": len(rows)}, "length": lengths, "return": returns}
        for f in specs:
            out[f.key] = _derived_moments(snap, f, positions) if f.derived else table.aggregate(f, rows)
        return out

    return answer(collection, body)


def _derived_moments(snap: Snapshot, f: FieldSpec, positions: np.ndarray) -> dict[str, Any]:
    """Statistics of derived per-step column ``f`` over the episodes at ``positions`` it was set for."""
    chosen = np.zeros(snap.num_episodes, dtype=bool)
    chosen[positions] = True
    chosen &= snap.derived_values().column(f.key).is_valid().to_numpy(zero_copy_only=False)
    return values_moments(f, snap.table_field(f)[np.repeat(chosen, np.diff(snap.offsets(f)))])
