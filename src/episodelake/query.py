"""SQL over episodes: DuckDB views of a snapshot, where(), select_episodes() and stats().

Every query runs in an in-process DuckDB cursor that sees two views, defined by
the ``.sql`` files shipped in ``episodelake/sql/``:

* ``episodes``: the snapshot's Delta table as an Arrow dataset (projection and
  filter pushdown, hive partition pruning). Storage encodings show through:
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

Statistics come from one SQL aggregate over the per-episode mergeable
statistics (``stats/<key>/{count,sum,sumsq,min,max}``) written at commit time.
They are loaded once per snapshot into a flat in-memory table in episode order
(lists split into one column per channel), so a subset's statistics cost a
``take`` of its rows plus one aggregate, never a pass over steps or tensors.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import CorruptionError, EpisodeLakeError, QueryError
from .schema import DatasetSchema, FieldSpec
from .snapshot import Snapshot
from .sql import quote, sql_template
from .stats import STAT_PARTS, aggregate, split_channels, stat_column, stat_fields
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


class _SnapshotSQL:
    """Per-snapshot state: a DuckDB database, the id -> position map and the statistics table."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.db = duckdb.connect()
        self.lock = threading.Lock()
        self._stats: dict[str, np.ndarray | pa.Array] = {}
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

    def stats_columns(self, fields: list[FieldSpec]) -> dict[str, np.ndarray | pa.Array]:
        """Length, return and the statistics of ``fields`` split per channel, as arrays in episode order."""
        with self.lock:
            todo = [f for f in fields if stat_column(f, "count") not in self._stats]
            if todo or not self._stats:
                self._stats.update(self._load_stats(todo, with_index=not self._stats))
            return self._stats

    def _load_stats(self, fields: list[FieldSpec], with_index: bool) -> dict[str, np.ndarray | pa.Array]:
        base = ["length", "return"] if with_index else []
        cols = [stat_column(f, p) for f in fields for p in STAT_PARTS]
        tbl = self.snap._read_table(["episode_id", *base, *cols])
        # rows come in file order: ``order`` puts them in episode order (snapshot positions)
        pos = self.lookup(tbl.column("episode_id").to_numpy())
        n = self.snap.num_episodes
        if tbl.num_rows != n or (np.bincount(pos, minlength=n) != 1).any():
            raise CorruptionError(f"snapshot version {self.snap.version}: episode ids in the table are not unique")
        order = np.empty(tbl.num_rows, dtype=np.int64)
        order[pos] = np.arange(tbl.num_rows)
        out: dict[str, np.ndarray | pa.Array] = {}
        for name in base:  # Arrow keeps a missing return NULL, so SQL aggregates skip it
            out[name] = tbl.column(name).combine_chunks().take(pa.array(order))
        out.update(split_channels(tbl, order, fields))
        return out


_STATE: weakref.WeakKeyDictionary[Snapshot, _SnapshotSQL] = weakref.WeakKeyDictionary()
_STATE_LOCK = threading.Lock()


@atexit.register
def _close_databases_at_exit() -> None:
    """Close every snapshot's DuckDB database before the interpreter tears down (its threads with it)."""
    with _STATE_LOCK:
        states = list(_STATE.values())
    for st in states:
        st.db.close()


def _state(snap: Snapshot) -> _SnapshotSQL:
    with _STATE_LOCK:
        st = _STATE.get(snap)
        if st is None:
            st = _STATE[snap] = _SnapshotSQL(snap)
        return st


def _is_view(collection: EpisodeCollection) -> bool:
    return getattr(collection, "_positions", None) is not None


def _steps_columns(collection: EpisodeCollection) -> tuple[str, str]:
    unnest, columns = [], []
    for f in collection.schema.table_step_fields:
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
    restriction = ""
    if _is_view(collection):
        cur.register("view_ids", pa.table({"episode_id": pa.array(collection.episode_ids, pa.int64())}))
        restriction = "SEMI JOIN view_ids USING (episode_id)"
    cur.execute(sql_template("episodes").substitute(restriction=restriction))
    unnest, columns = _steps_columns(collection)
    cur.execute(sql_template("steps").substitute(unnest=unnest, columns=columns))
    return cur


def run_sql(collection: EpisodeCollection, query: str, params: Any = None) -> duckdb.DuckDBPyRelation | None:
    """Run ``query`` over ``episodes``/``steps``; a lazy DuckDB relation (None for statements without rows).

    ``params`` binds ``?`` or ``$name`` placeholders (a sequence or a mapping).
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError(f"query must be a non-empty SQL string, got {query!r}")
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


def where(collection: EpisodeCollection, predicate: str) -> tuple[Snapshot, np.ndarray]:
    """The episodes of ``collection`` for which the SQL ``predicate`` over ``episodes`` is true.

    Returns the snapshot queried and their positions in it. ``predicate`` is
    parsed as one SQL expression (anything else is a :class:`QueryError`).
    """
    if not isinstance(predicate, str) or not predicate.strip():
        raise QueryError(f"where() needs a SQL predicate string, got {predicate!r}")
    ids = _episode_ids(
        collection,
        connect(collection),
        lambda cur: cur.table("episodes").filter(predicate).project("episode_id"),
        f"invalid where() predicate {predicate!r}",
    )
    return _subset(collection, ids)


def select_episodes(collection: EpisodeCollection, query: str) -> tuple[Snapshot, np.ndarray]:
    """The episodes whose ``episode_id`` the SQL ``query`` returns (duplicates count once).

    Returns the snapshot queried and their positions in it. Ids outside ``collection`` raise :class:`QueryError`.
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError(f"select_episodes() needs a SQL query string, got {query!r}")
    ids = _episode_ids(
        collection, connect(collection), lambda cur: cur.sql(query), f"invalid select_episodes() query {query!r}"
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
    without channels gives floats. An empty subset gives NaN. Computed by one
    SQL aggregate over the commit-time statistics; no tensor is read.
    """
    specs = stat_fields(collection.schema, fields)
    state = _state(collection.snapshot())
    columns = state.stats_columns(specs)
    return aggregate(state.db.cursor(), columns, specs, collection.positions if _is_view(collection) else None)
