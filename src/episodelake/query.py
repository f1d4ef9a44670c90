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
episodes. Each query gets its own cursor, so a returned relation stays valid
(and lazy) however many queries follow it.

Damaged table files: the first query of a snapshot checks that every table
file its log references exists with the logged size (one listing, no file is
opened, so partition pruning is kept); a missing or truncated file raises
:class:`~episodelake.errors.CorruptionError` naming it. A scan that fails later
(damage inside a file) is reported as ``CorruptionError`` too, except from a
lazy relation returned by :func:`run_sql`, which DuckDB fetches in the caller.

``where()`` runs first over the snapshot's index columns, already in memory
from its one index scan (:meth:`Snapshot.scan`); a predicate that needs other
columns (per-step lists, statistics) runs over ``episodes`` instead.

Statistics come from the per-episode mergeable statistics
(``stats/<key>/{count,sum,sumsq,min,max}``) written at commit time, read
once per snapshot, per field, and only from the table files that hold the
collection's episodes, into a :class:`~episodelake.stats.StatsTable`; a
subset's statistics are then one NumPy gather and reduction over its rows,
never a pass over steps or tensors.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ArgumentError, CorruptionError, EpisodeLakeError, QueryError
from .schema import DatasetSchema, FieldSpec
from .snapshot import Snapshot
from .sql import quote, sql_template
from .stats import STAT_PARTS, StatsTable, stat_column, stat_fields, value_moments, values_moments
from .table import EpisodeTable


class EpisodeCollection(Protocol):
    """What the query functions read from a Dataset or a DatasetView (``_positions`` None: all episodes)."""

    _positions: np.ndarray | None

    @property
    def schema(self) -> DatasetSchema: ...

    def snapshot(self) -> Snapshot: ...

    @property
    def positions(self) -> np.ndarray: ...

    @property
    def episode_ids(self) -> np.ndarray: ...


def next_key(f: FieldSpec) -> str:
    """Name of the ``steps`` column holding observation row ``t + 1`` of ``f``."""
    return f"next_{f.key}"


POSITION = "__position"  # the in-memory index table's column of snapshot positions


class _SnapshotSQL:
    """Per-snapshot state: a DuckDB connection, the in-memory index table and the statistics table."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.db = _database().cursor()
        self.lock = threading.Lock()
        self._stats: StatsTable | None = None
        self._index: pa.Table | None = None
        self._episode_values: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._stats_files: dict[str, np.ndarray] = {}  # field key -> which table files are in _stats
        self._files_checked = False

    def check_files(self, again: bool = False) -> None:
        """Every table file exists with the size its log entry records, else CorruptionError naming it.

        Once per snapshot unless ``again``. A listing, not a read: partition
        pruning still decides which files a query opens.
        """
        with self.lock:
            if self._files_checked and not again:
                return
            snap = self.snap
            table = EpisodeTable.open(snap.loc, snap.version)
            listed = table.stored_files()
            for add in table.add_actions():
                path, size = table.file_path(add["path"]), add["size_bytes"]
                found = listed.get(path)
                if found is None:
                    raise CorruptionError(f"{snap.loc.url} version {snap.version}: table file {path} is missing")
                if found != size:
                    raise CorruptionError(
                        f"{snap.loc.url} version {snap.version}: table file {path} has {found} bytes, "
                        f"its log entry says {size} (truncated or overwritten)"
                    )
            self._files_checked = True

    def scan_failed(self, exc: duckdb.Error) -> CorruptionError | None:
        """The CorruptionError for a DuckDB error raised while scanning the episode table, else None."""
        if "'episode_table'" not in str(exc):  # DuckDB names the Arrow stream that failed
            return None
        self.check_files(again=True)  # Arrow caches footers, so list again rather than re-read to find the file
        return CorruptionError(f"{self.snap.loc.url} version {self.snap.version}: episode table unreadable: {exc}")

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
                self._episode_values = (
                    table.column("length").to_numpy(),
                    returns.to_numpy(zero_copy_only=False),
                    returns.is_valid().to_numpy(zero_copy_only=False),
                )
            return self._episode_values

    def stats_table(self, fields: list[FieldSpec], rows: np.ndarray) -> StatsTable:
        """The statistics table, holding ``fields`` at least for the scan ``rows``.

        Reads the statistics columns of the fields still missing there, once,
        from the table files holding ``rows`` only (partitions a collection
        does not touch are never read).
        """
        with self.lock:
            scan = self.snap.scan()
            if self._stats is None:
                self._stats = StatsTable(scan.table.num_rows)
            needed = np.zeros(len(scan.fragments), dtype=bool)
            needed[scan.file[rows]] = True
            done = {f.key: self._stats_files.setdefault(f.key, np.zeros(len(needed), dtype=bool)) for f in fields}
            todo = [f for f in fields if (needed & ~done[f.key]).any()]
            if todo:
                files = np.flatnonzero(np.logical_or.reduce([needed & ~done[f.key] for f in todo]))
                columns = [stat_column(f, p) for f in todo for p in STAT_PARTS]
                for rows_read, piece in self.snap.read_files(columns, files):
                    for f in todo:
                        self._stats.fill(f, rows_read, piece)
                for f in todo:
                    done[f.key][files] = True
            return self._stats


_STATE: weakref.WeakKeyDictionary[Snapshot, _SnapshotSQL] = weakref.WeakKeyDictionary()
_STATE_LOCK = threading.Lock()
_DB: tuple[int, duckdb.DuckDBPyConnection] | None = None
_DB_LOCK = threading.Lock()  # not _STATE_LOCK: _state() holds that while it makes a state, which opens a connection


def _database() -> duckdb.DuckDBPyConnection:
    """The process's in-memory DuckDB database; each snapshot (and query) gets its own connection to it.

    One database, not one per snapshot: opening a database costs 15-50 ms, a
    connection microseconds, and a new snapshot per commit is a learner's
    refresh. Temporary views and registered tables are per connection.
    """
    global _DB
    with _DB_LOCK:
        if _DB is None or _DB[0] != os.getpid():  # a forked process opens its own
            _DB = (os.getpid(), duckdb.connect())
        return _DB[1]


@atexit.register
def _close_databases_at_exit() -> None:
    """Close every DuckDB connection and the database before the interpreter tears down (its threads with it)."""
    with _STATE_LOCK:
        states = list(_STATE.values())
    with _DB_LOCK:
        db = _DB
    for st in states:
        st.db.close()
    if db is not None and db[0] == os.getpid():
        db[1].close()


def _state(snap: Snapshot) -> _SnapshotSQL:
    with _STATE_LOCK:
        st = _STATE.get(snap)
        if st is None:
            st = _STATE[snap] = _SnapshotSQL(snap)
        return st


def _is_view(collection: EpisodeCollection) -> bool:
    return getattr(collection, "_positions", None) is not None


def _steps_columns(snap: Snapshot) -> tuple[str, str]:
    unnest, columns = [], []
    for f in snap.schema.table_step_fields:
        col = quote(f.key)
        if f.role == "observation":
            unnest.append(f"unnest({col}[1:length]) AS {col}")
            unnest.append(f"unnest({col}[2:length + 1]) AS {quote(next_key(f))}")
            columns += [col, quote(next_key(f))]
        else:
            unnest.append(f"unnest({col}) AS {col}")
            columns.append(col)
    return "".join(f",\n    {u}" for u in unnest), "".join(f",\n    {c}" for c in columns)


def connect(collection: EpisodeCollection) -> duckdb.DuckDBPyConnection:
    """A fresh DuckDB cursor with the ``episodes`` and ``steps`` views of ``collection``."""
    snap = collection.snapshot()
    state = _state(snap)
    state.check_files()
    cur = state.db.cursor()
    cur.register("episode_table", snap.arrow_dataset())
    restriction = derived = join = ""
    if snap.derived.fields:
        cur.register("derived_table", snap.derived_values())
        derived = "".join(f", derived_table.{quote(f.key)}" for f in snap.derived.fields)
        join = "LEFT JOIN derived_table USING (episode_id)"
    if _is_view(collection):
        cur.register("view_ids", pa.table({"episode_id": pa.array(collection.episode_ids, pa.int64())}))
        restriction = "SEMI JOIN view_ids USING (episode_id)"
    cur.execute(sql_template("episodes").substitute(derived=derived, join=join, restriction=restriction))
    unnest, columns = _steps_columns(snap)
    cur.execute(sql_template("steps").substitute(unnest=unnest, columns=columns))
    return cur


def run_sql(collection: EpisodeCollection, query: str, params: Any = None) -> duckdb.DuckDBPyRelation | None:
    """Run ``query`` over ``episodes``/``steps``; a lazy DuckDB relation (None for statements without rows).

    ``params`` binds ``?`` or ``$name`` placeholders (a sequence or a mapping).
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError(f"query must be a non-empty SQL string, got {query!r}")
    check_params(params, "sql()")
    cur = connect(collection)
    try:
        return cur.sql(query, params=params)
    except duckdb.Error as exc:
        raise _fetch_error(collection, exc, f"SQL error in {query!r}") from exc


def sql_arrow(collection: EpisodeCollection, query: str, params: Any = None) -> pa.Table:
    """The result of ``query`` as an Arrow table."""
    rel = run_sql(collection, query, params)
    if rel is None:
        raise QueryError(f"query {query!r} returns no rows to fetch")
    try:
        return rel.to_arrow_table()
    except duckdb.Error as exc:
        raise _fetch_error(collection, exc, f"SQL error in {query!r}") from exc


def _fetch_error(collection: EpisodeCollection, exc: duckdb.Error, what: str) -> EpisodeLakeError:
    """A DuckDB error while fetching: CorruptionError when the table scan failed, else QueryError."""
    return _state(collection.snapshot()).scan_failed(exc) or QueryError(f"{what}: {exc}")


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


def sql_numpy(collection: EpisodeCollection, query: str, params: Any = None) -> dict[str, np.ndarray]:
    """The result of ``query`` as NumPy columns (see :func:`column_numpy`)."""
    tbl = sql_arrow(collection, query, params)
    return {name: column_numpy(tbl.column(name)) for name in tbl.column_names}


def _subset(collection: EpisodeCollection, ids: np.ndarray) -> tuple[Snapshot, np.ndarray]:
    """The collection's snapshot and the positions of ``ids`` in it (episode order, no duplicates)."""
    snap = collection.snapshot()
    return snap, _state(snap).positions_of(ids)


def _episode_ids(
    collection: EpisodeCollection,
    cur: duckdb.DuckDBPyConnection,
    relation: Callable[[duckdb.DuckDBPyConnection], duckdb.DuckDBPyRelation | None],
    what: str,
) -> np.ndarray:
    """The ``episode_id`` column of ``relation(cur)``, validated; DuckDB errors become QueryError."""
    try:
        rel = relation(cur)
        if rel is None:
            raise QueryError(f"{what}: the query returns no rows")
        tbl = rel.to_arrow_table()
    except duckdb.Error as exc:
        raise _fetch_error(collection, exc, what) from exc
    if "episode_id" not in tbl.column_names:
        raise QueryError(f"{what}: the query must return an episode_id column, got {tbl.column_names}")
    ids = tbl.column("episode_id")
    if not pa.types.is_integer(ids.type) or ids.null_count:
        raise QueryError(f"{what}: episode_id must be non-null integers, got {ids.type}")
    return ids.to_numpy()


def check_params(params: Any, what: str) -> Any:
    """``params`` if DuckDB can bind it (None, a list/tuple of values or a mapping of names), else ArgumentError."""
    if params is None or isinstance(params, list | tuple | Mapping):
        return params
    raise ArgumentError(f"{what}: params must be a list or tuple of values or a mapping of names, got {params!r}")


def _predicate(predicate: Any, what: str) -> str:
    """``predicate`` if it parses as exactly one SQL expression (placeholders allowed), else QueryError."""
    if not isinstance(predicate, str) or not predicate.strip():
        raise QueryError(f"{what} needs a SQL predicate string, got {predicate!r}")
    try:
        duckdb.SQLExpression(predicate)
    except duckdb.Error as exc:
        raise QueryError(f"invalid {what} predicate {predicate!r}: {exc}") from exc
    return predicate


def where(collection: EpisodeCollection, predicate: str, params: Any = None) -> tuple[Snapshot, np.ndarray]:
    """The episodes of ``collection`` for which the SQL ``predicate`` over ``episodes`` is true.

    Returns the snapshot queried and their positions in it. ``predicate`` must
    parse as one SQL expression (anything else is a :class:`QueryError`);
    ``params`` binds its ``?`` or ``$name`` placeholders (a sequence or a
    mapping), by DuckDB. The predicate runs over the in-memory index columns
    when it uses only those, else over ``episodes``.
    """
    _predicate(predicate, "where()")
    check_params(params, "where()")
    snap = collection.snapshot()
    state = _state(snap)
    state.check_files()
    cur = state.db.cursor()
    cur.register("episode_index", state.index_table(collection.positions if _is_view(collection) else None))
    what = f"invalid where() predicate {predicate!r}"
    # the predicate on lines of its own: a trailing -- comment cannot reach the closing parenthesis
    condition = " WHERE (\n" + predicate + "\n)"
    try:
        try:
            found = cur.sql(f"SELECT {quote(POSITION)} FROM episode_index" + condition, params=params)
            positions = found.to_arrow_table().column(0).to_numpy()
        except (duckdb.BinderException, duckdb.CatalogException):  # needs more than the index: other columns, views
            ids = _episode_ids(
                collection,
                connect(collection),
                lambda c: c.sql("SELECT episode_id FROM episodes" + condition, params=params),
                what,
            )
            return _subset(collection, ids)
    except duckdb.Error as exc:
        raise _fetch_error(collection, exc, what) from exc
    return snap, np.sort(positions)


def select_episodes(collection: EpisodeCollection, query: str, params: Any = None) -> tuple[Snapshot, np.ndarray]:
    """The episodes whose ``episode_id`` the SQL ``query`` returns (duplicates count once).

    Returns the snapshot queried and their positions in it. ``params`` binds the
    query's placeholders. Ids outside ``collection`` raise :class:`QueryError`.
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError(f"select_episodes() needs a SQL query string, got {query!r}")
    check_params(params, "select_episodes()")
    ids = _episode_ids(
        collection,
        connect(collection),
        lambda cur: cur.sql(query, params=params),
        f"invalid select_episodes() query {query!r}",
    )
    snap, positions = _subset(collection, ids)
    if _is_view(collection):
        outside = np.setdiff1d(positions, collection.positions)
        if len(outside):
            bad = snap.index["episode_id"][outside][:10].tolist()
            raise QueryError(f"select_episodes(): episode ids not in this view: {bad}")
    return snap, positions


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
    snap = collection.snapshot()
    specs = stat_fields(snap.schema, fields)
    scan = snap.scan()
    state = _state(snap)
    # sorted scan rows: sequential gathers (statistics of a set do not depend on its order)
    rows = np.sort(scan.order[collection.positions]) if _is_view(collection) else np.arange(len(scan.order))
    table = state.stats_table([f for f in specs if not f.derived], rows)
    length, returns, has_return = state.episode_values()
    out: dict[str, dict[str, Any]] = {
        "episodes": {"count": len(rows)},
        "length": value_moments(length[rows]),
        "return": value_moments(returns[rows[has_return[rows]]]),
    }
    for f in specs:
        out[f.key] = _derived_moments(snap, f, collection.positions) if f.derived else table.aggregate(f, rows)
    return out


def _derived_moments(snap: Snapshot, f: FieldSpec, positions: np.ndarray) -> dict[str, Any]:
    """Statistics of derived per-step column ``f`` over the episodes at ``positions`` it was set for."""
    chosen = np.zeros(snap.num_episodes, dtype=bool)
    chosen[positions] = True
    chosen &= snap.derived_values().column(f.key).is_valid().to_numpy(zero_copy_only=False)
    return values_moments(f, snap.table_field(f)[np.repeat(chosen, np.diff(snap.offsets(f)))])
