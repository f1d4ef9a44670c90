"""``el.concat([ds_a, ds_b, ...], weights=None)``: one read-only view over datasets with the same schema.

A :class:`ConcatView` keeps its sources (datasets or views, each pinned to the
snapshot it had when the concat was made) in order; source ``s``'s episodes
come before source ``s + 1``'s. Episode ids are only unique within a source,
so episodes are identified by ``(source, episode_id)``.

* SQL: the ``episodes`` and ``steps`` views are the sources' views stacked
  (``UNION ALL BY NAME``) with a leading ``source`` column (the source's index).
  Each source's ``episodes`` view is read into memory once per concat (its
  ``steps`` view too, the first time a query names ``steps``); queries then run
  over those in-memory tables.
* Sampling mixes the sources: each item of a batch independently comes from
  source ``s`` with probability ``weights[s] / sum(weights)``, or, without
  weights, in proportion to the source's sampling units (segments, transitions
  or episodes), which makes the mix uniform over the union. Inside a source,
  items are drawn exactly as the source's own sampler draws them (the
  per-source ``segment_stream``/``sample_transitions``), so per-episode
  weights (``sampler=el.Weighted(...)``) and the other sampling options apply
  within each source.
  Everything is seeded: the same seed gives the same batches, and a concat
  stream's ``state_dict()`` resumes it exactly.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .core.errors import ArgumentError, QueryError, SchemaError
from .core.schema import DatasetSchema
from .dataset import Dataset, DatasetView, EpisodeRef
from .read.query import (
    SQLResult,
    Views,
    check_selection,
    database,
    positions_in,
    query_failure,
    sql_over,
    where_condition,
)
from .read.selection import select
from .sampling.batch import SegmentBatch, Transitions
from .sampling.options import Shard, Strategy, Weighted, Window, sampler_of, window_of
from .sampling.segment_index import check_positive, check_seed
from .sampling.spellings import spelled
from .sampling.stream import SegmentStream
from .sampling.trajectories import TrajectoryStream, check_probs, fresh_seed, join_items, to_numpy

SOURCE = "source"
CONCAT_SAMPLERS = ("uniform", "weighted")  # each source draws with replacement; a source per item by its weight
STATE_FORMAT = 1
_NAMES_STEPS = re.compile(r"\bsteps\b", re.IGNORECASE)
T = TypeVar("T")


def _read_contract(schema: DatasetSchema) -> dict[str, tuple[Any, ...]]:
    """What readers see of each field: sources agreeing on this can be read as one."""
    return {f.key: (f.role, f.dtype, f.shape, f.layout, f.in_tensor) for f in schema.fields}


def _describe(contract: tuple[Any, ...]) -> str:
    role, dtype, shape, layout, in_tensor = contract
    where = "tensor" if in_tensor else "table"
    return f"{role} {dtype}{list(shape)}" + (f" layout {layout}" if layout else "") + f" ({where})"


def check_same_schema(schemas: Sequence[DatasetSchema]) -> None:
    """SchemaError naming the first field in which a source's schema differs from source 0's."""
    first = _read_contract(schemas[0])
    for s, schema in enumerate(schemas[1:], start=1):
        other = _read_contract(schema)
        for key in [*first, *(k for k in other if k not in first)]:
            if first.get(key) != other.get(key):
                mine = "missing" if key not in other else _describe(other[key])
                theirs = "missing" if key not in first else _describe(first[key])
                raise SchemaError(f"el.concat: field {key!r} is {mine} in source {s} but {theirs} in source 0")


def _merge_moments(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Count/sum/mean/std/min/max of one quantity from its parts (population std, NaN when empty)."""
    count = sum(int(p["count"]) for p in parts)
    out: dict[str, Any] = {"count": count}
    if "sum" not in parts[0]:
        return out
    full = [p for p in parts if int(p["count"]) > 0]
    if not full:
        return {**parts[0], "count": 0}
    n = np.array([float(p["count"]) for p in full]).reshape(-1, *[1] * np.ndim(full[0]["mean"]))
    total = np.sum([np.asarray(p["sum"], np.float64) for p in full], axis=0)
    mean = total / n.sum(axis=0)
    sumsq = np.sum(
        [c * (np.asarray(p["std"]) ** 2 + np.asarray(p["mean"]) ** 2) for c, p in zip(n, full, strict=True)], axis=0
    )
    std = np.sqrt(np.maximum(sumsq / n.sum(axis=0) - mean**2, 0.0))
    lo = np.min([np.asarray(p["min"], np.float64) for p in full], axis=0)
    hi = np.max([np.asarray(p["max"], np.float64) for p in full], axis=0)
    scalar = np.ndim(full[0]["mean"]) == 0
    for name, value in (("sum", total), ("mean", mean), ("std", std), ("min", lo), ("max", hi)):
        out[name] = float(value) if scalar else value
    return out


class ConcatView:
    """Several datasets/views with the same schema read as one (see module docstring). Make with :func:`concat`."""

    def __init__(self, sources: Sequence[Dataset | DatasetView], weights: Any = None) -> None:
        if isinstance(sources, Dataset | DatasetView | str) or not isinstance(sources, Sequence) or not sources:
            raise ArgumentError("el.concat needs a non-empty list of datasets or views")
        for s, src in enumerate(sources):
            if not isinstance(src, Dataset | DatasetView):
                raise ArgumentError(f"el.concat: source {s} is a {type(src).__name__}, not a Dataset or DatasetView")
        check_same_schema([src.schema for src in sources])
        if any(f.role == "meta" and f.name == SOURCE for f in sources[0].schema.fields):
            raise SchemaError(f"el.concat: meta field {SOURCE!r} would shadow the concat's {SOURCE!r} column")
        # a Dataset moves with its commits: pin each source to its snapshot now, as a view of all its episodes
        self.sources: tuple[DatasetView, ...] = tuple(
            _pinned(src) if isinstance(src, Dataset) else src for src in sources
        )
        if weights is not None:
            check_probs(weights, [1] * len(self.sources))
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self._tables: dict[str, list[pa.Table]] = {}

    # ---- episodes: each source's own reads, in source order
    @property
    def schema(self) -> DatasetSchema:
        return self.sources[0].schema

    def __len__(self) -> int:
        return sum(len(src) for src in self.sources)

    @property
    def num_steps(self) -> int:
        return sum(src.num_steps for src in self.sources)

    @property
    def episode_ids(self) -> np.ndarray:
        """Every source's episode ids, in source order (an id may repeat across sources)."""
        return np.concatenate([src.episode_ids for src in self.sources])

    def episodes(self) -> Iterator[EpisodeRef]:
        """Every source's episodes, in source order."""
        return itertools.chain.from_iterable(src.episodes() for src in self.sources)

    def episode(self, i: int | None = None, *, id: int | None = None) -> EpisodeRef:
        """The ``i``-th episode of the union (source order; negative counts from the end), or the one with ``id``.

        Exactly one of ``i`` and ``id`` (:class:`ArgumentError` otherwise). Ids
        are unique within a source only: an ``id`` that several sources hold is
        an ArgumentError (ask ``concat.sources[s].episode(id=...)``), one none
        holds a KeyError; an index out of range raises IndexError.
        """
        if (i is None) == (id is None):
            raise ArgumentError("episode takes a position i or id=, exactly one of them")
        if id is not None:
            holders = [s for s, src in enumerate(self.sources) if np.isin(id, src.episode_ids)]
            if len(holders) > 1:
                raise ArgumentError(
                    f"episode id {id} is in sources {holders}: ids are unique within a source; "
                    "use concat.sources[s].episode(id=...)"
                )
            if not holders:
                raise KeyError(f"no episode with id {id}")
            return self.sources[holders[0]].episode(id=id)
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"episode index must be an int, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"episode index {i} out of range for {n} episodes")
        starts = np.cumsum([0, *(len(src) for src in self.sources)])
        s = int(np.searchsorted(starts, i % n, side="right")) - 1
        return self.sources[s].episode(int(i % n - starts[s]))

    def __repr__(self) -> str:
        sizes = ", ".join(str(len(src)) for src in self.sources)
        weights = "" if self.weights is None else f", weights={self.weights.tolist()}"
        return f"ConcatView({len(self.sources)} sources of [{sizes}] episodes{weights})"

    # ---- SQL: the shared query functions over the stacked views
    def _source_tables(self, view: str) -> list[pa.Table]:
        """Each source's ``view`` rows with a leading ``source`` column, read once per concat."""
        if view not in self._tables:
            tables = []
            for s, src in enumerate(self.sources):
                rows = src.sql(f"SELECT * FROM {view}")
                assert rows is not None  # a SELECT has rows
                tbl = rows.to_arrow_table()
                tables.append(tbl.add_column(0, SOURCE, pa.array(np.full(tbl.num_rows, s, np.int64))))
            self._tables[view] = tables
        return self._tables[view]

    def sql(self, query: str, params: Any = None, sandbox: bool = False) -> SQLResult | None:
        """:meth:`Dataset.sql` over the stacked ``episodes``/``steps`` views, which lead with a ``source`` column.

        The same lazy :class:`~episodelake.read.query.SQLResult` (None for a
        statement without a result), ``params`` and ``sandbox`` as a dataset's.
        """
        return sql_over(_Stacked(self, query), query, params, sandbox)

    def where(self, predicate: str, params: Any = None) -> ConcatView:
        """The episodes for which a SQL predicate over the stacked ``episodes`` view holds (same weights).

        As :meth:`Dataset.where`: one SQL expression, ``params`` binding its
        ``?``/``$name`` placeholders, run sandboxed; it may name ``source``.
        """
        what, condition = where_condition(predicate, params)
        query = f"SELECT {SOURCE}, episode_id FROM episodes" + condition
        return self._chosen(SQLResult(_Stacked(self, predicate), query, params, True, what).to_arrow_table(), what)

    def select_episodes(self, query: str, params: Any = None) -> ConcatView:
        """The episodes whose ``(source, episode_id)`` a SQL query returns (same weights; duplicates count once).

        As :meth:`Dataset.select_episodes`, over the stacked views: the query
        must return ``source`` and ``episode_id`` columns.
        """
        what = check_selection(query, params)
        return self._chosen(SQLResult(_Stacked(self, query), query, params, True, what).to_arrow_table(), what)

    def _chosen(self, rows: pa.Table, what: str) -> ConcatView:
        """The concat of each source's episodes named by the ``(source, episode_id)`` rows of a query."""
        if SOURCE not in rows.column_names:
            raise QueryError(f"{what}: the query must return {SOURCE} and episode_id columns, got {rows.column_names}")
        views, taken = [], 0
        for s, src in enumerate(self.sources):
            mine = rows.filter(pc.equal(rows.column(SOURCE), s))
            taken += mine.num_rows
            snap = src.snapshot()
            positions = positions_in(snap, mine, what)
            outside = np.setdiff1d(positions, src.positions)
            if len(outside):
                bad = snap.index["episode_id"][outside][:10].tolist()
                raise QueryError(f"{what}: episode ids not in source {s}: {bad}")
            views.append(src._view(snap, positions))
        if taken < rows.num_rows:
            raise QueryError(f"{what}: {SOURCE} must be a source index in [0, {len(self.sources)})")
        return ConcatView(views, self.weights)

    def stats(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """:meth:`Dataset.stats` of the union, merged exactly from each source's mergeable moments."""
        parts = [src.stats(fields) for src in self.sources]
        return {key: _merge_moments([p[key] for p in parts]) for key in parts[0]}

    # ---- whole episodes
    def to_numpy(self, pad: bool = False) -> dict[str, np.ndarray]:
        """:meth:`Dataset.to_numpy` of the union (episodes in source order) plus ``source`` ``[N]``."""
        longest = max((int(src.snapshot().lengths[src.positions].max(initial=0)) for src in self.sources), default=0)
        parts = [to_numpy(src.snapshot(), src.positions, pad=bool(pad), length=longest) for src in self.sources]
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k not in ("offsets", "obs_offsets")}
        out[SOURCE] = np.repeat(np.arange(len(parts)), [len(p["length"]) for p in parts])
        if not pad:
            offsets = np.concatenate([[0], np.cumsum(out["length"])]).astype(np.int64)
            out.update(offsets=offsets, obs_offsets=offsets + np.arange(len(offsets)))
        return out

    def trajectories(
        self,
        batch_size: int,
        *,
        sampler: Strategy | None = None,
        seed: int | None = None,
        drop_last: bool = False,
        where: str | None = None,
        filter: Callable[[EpisodeRef], bool] | None = None,
        pad_value: float = 0,
    ) -> TrajectoryStream:
        """:meth:`Dataset.trajectories` over the union; with replacement, a source per item by ``weights``."""
        chosen = [select(src, where, filter) for src in self.sources]
        return TrajectoryStream(
            self.schema,
            chosen,
            batch_size,
            probs=self.weights,
            seed=seed,
            sampler=sampler,
            drop_last=drop_last,
            pad_value=pad_value,
        )

    # ---- sampling
    def _narrowed(self, where: str | None, filter: Callable[[EpisodeRef], bool] | None) -> Sequence[DatasetView]:
        if where is None and filter is None:
            return self.sources
        out = []
        for src in self.sources:
            snap, positions = select(src, where, filter)
            out.append(src._view(snap, positions))
        return out

    def _strategy(self, sampler: Any, method: str) -> Strategy:
        """``sampler=`` of a concat's draws: uniform or weighted within each source (weighted: with source weights)."""
        strategy = cast(Strategy, sampler_of(sampler, f"el.concat(...).{method}", CONCAT_SAMPLERS))
        if isinstance(strategy, Weighted) and self.weights is None:
            raise ArgumentError(
                f"{method}: per-episode el.Weighted on a concat needs source weights: el.concat(..., weights=[...])"
            )
        return strategy

    def sample_transitions(
        self,
        batch_size: int,
        *,
        n_step: int = 1,
        gamma: float = 0.99,
        history: int = 1,
        horizon: int = 1,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
        sampler: Strategy | None = None,
        where: str | None = None,
        filter: Callable[[EpisodeRef], bool] | None = None,
        transform: Mapping[str, Any] | None = None,
        **spellings: Any,
    ) -> Transitions:
        """:meth:`Dataset.sample_transitions` over the union: each item's source drawn by ``weights``.

        ``batch.source`` holds each item's source index. ``sampler``
        (``el.Uniform()`` or ``el.Weighted``) and the other options apply
        within each source; ``spellings``: episodata's (see :func:`~episodelake.sampling.spellings.spelled`).
        """
        B = check_positive(batch_size, "batch_size")
        spelled("sample_transitions", None, sampler, spellings)
        strategy = self._strategy(sampler, "sample_transitions")
        if rng is None:
            rng = np.random.default_rng(check_seed(seed))
        elif not isinstance(rng, np.random.Generator):
            raise ArgumentError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        views = self._narrowed(where, filter)
        probs = check_probs(self.weights, [v.num_steps for v in views])
        which = _draw_sources(rng, probs, B)
        options = dict(n_step=n_step, gamma=gamma, history=history, horizon=horizon, transform=transform)
        parts, items = [], []
        for s in np.unique(which).tolist():
            hit = np.flatnonzero(which == s)
            parts.append(views[s].sample_transitions(len(hit), rng=rng, sampler=strategy, **options))
            items.append(hit)
        order = np.argsort(np.concatenate(items), kind="stable")
        first = parts[0]
        buffers = {k: np.concatenate([p.buffers[k] for p in parts])[order] for k in first.buffers}
        buffers[SOURCE] = which
        return Transitions(first.schema, buffers, first.history, first.horizon, first.next_at)

    def segment_stream(
        self,
        window: Window | int | None = None,
        *,
        batch_size: int = 64,
        sampler: Strategy | None = None,
        seed: int | None = None,
        where: str | None = None,
        filter: Callable[[EpisodeRef], bool] | None = None,
        shard: Shard | Sequence[int] | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
        follow: bool = False,
        transform: Mapping[str, Any] | None = None,
        **spellings: Any,
    ) -> ConcatStream:
        """An infinite stream of segment batches mixing the sources (with replacement); see :class:`ConcatStream`.

        Arguments are :meth:`Dataset.segment_stream`'s and apply within each
        source; ``sampler``: ``el.Uniform()`` or ``el.Weighted`` (per-episode
        weights need ``el.concat(..., weights=)`` to mix the sources).
        ``batch.source`` holds each item's source. ``spellings``: episodata's
        keywords, the same window and sampler (see :func:`~episodelake.sampling.spellings.spelled`).
        """
        B = check_positive(batch_size, "batch_size")
        window, sampler = spelled("segment_stream", window, sampler, spellings)
        win = window_of(window)
        strategy = self._strategy(sampler, "segment_stream")
        seed = check_seed(seed)
        if seed is None:
            seed = fresh_seed()
        views = self._narrowed(where, filter)
        if self.weights is None:
            sizes = [len(v.segments(win)) if len(v) else 0 for v in views]
        else:
            sizes = [len(v) for v in views]
        probs = check_probs(self.weights, sizes)
        options: dict[str, Any] = dict(
            batch_size=B,
            sampler=strategy,
            shard=shard,
            prefetch=prefetch,
            drop_last=drop_last,
            follow=follow,
            transform=transform,
        )
        streams = [
            v.segment_stream(win, seed=_source_seed(seed, s), **options) if probs[s] > 0 else None
            for s, v in enumerate(views)
        ]
        return ConcatStream(streams, probs, B, seed)


def _pinned(ds: Dataset) -> DatasetView:
    snap = ds.snapshot()
    return DatasetView(ds, snap, np.arange(snap.num_episodes))


class _Stacked:
    """A concat's query views: its sources' ``episodes`` (and ``steps``, when the SQL names them) stacked.

    Each source's rows lead with its index as ``source``. The sources are
    pinned views, so a query over them never re-plans on a newer version.
    """

    def __init__(self, view: ConcatView, sql: str) -> None:
        self.view = view
        self.names = ("episodes", "steps") if isinstance(sql, str) and _NAMES_STEPS.search(sql) else ("episodes",)

    def cursor(self, sandbox: bool) -> duckdb.DuckDBPyConnection:
        cur = database(sandbox=sandbox).cursor()
        for name in self.names:
            parts = []
            for s, tbl in enumerate(self.view._source_tables(name)):
                cur.register(f"{name}_{s}", tbl)
                parts.append(f"SELECT * FROM {name}_{s}")
            cur.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS " + " UNION ALL BY NAME ".join(parts))
        return cur

    def failure(self, exc: duckdb.Error, what: str) -> QueryError:
        return query_failure(exc, what)  # the stacked tables are in memory: a failure is the query's

    def answer(self, body: Callable[[Views], T]) -> T:
        return body(self)


def _source_seed(seed: int, s: int) -> int:
    return int(np.random.SeedSequence([seed, s]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _draw_sources(rng: np.random.Generator, probs: np.ndarray, n: int) -> np.ndarray:
    """``n`` independent source indices, ``P(s) = probs[s]`` (zero-probability sources never drawn)."""
    which = np.searchsorted(np.cumsum(probs), rng.random(n), side="right")
    return np.minimum(which, len(probs) - 1).astype(np.int64)


class _Feed:
    """Items of one source's stream, handed out a few at a time; remembers how to rebuild its current batch."""

    def __init__(self, stream: SegmentStream) -> None:
        self.stream = stream
        self.batch: SegmentBatch | None = None
        self.before: dict[str, Any] | None = None  # the stream's state before ``batch`` was drawn
        self.used = 0

    def take(self, n: int) -> list[SegmentBatch]:
        out: list[SegmentBatch] = []
        while n > 0:
            if self.batch is None or self.used == len(self.batch.episode_id):
                self.before = self.stream.state_dict()
                self.batch, self.used = self.stream.sample(), 0
            k = min(n, len(self.batch.episode_id) - self.used)
            out.append(_items(self.batch, slice(self.used, self.used + k)))
            self.used += k
            n -= k
        return out

    def state(self) -> dict[str, Any]:
        if self.batch is None or self.used == len(self.batch.episode_id):
            return {"stream": self.stream.state_dict(), "used": 0}
        return {"stream": self.before, "used": self.used}

    def load(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        self.batch, self.before, self.used = None, None, 0
        if state["used"]:
            self.before = state["stream"]
            self.batch, self.used = self.stream.sample(), int(state["used"])


def _items(batch: SegmentBatch, sel: slice) -> SegmentBatch:
    """Items ``sel`` of a batch (views)."""
    return SegmentBatch.wrap(batch.map(lambda a: a[sel]), batch.context_length)


class MixedBatch(SegmentBatch):
    """A segment batch of a :class:`ConcatStream`: ``source[b]`` is item ``b``'s source index."""

    source: np.ndarray


class ConcatStream:
    """Segment batches drawn from several sources' streams (see :mod:`concat`); infinite, with replacement.

    Each item comes from source ``s`` with probability ``probs[s]``,
    independently; items of a source come from its own stream in order.
    ``state_dict()`` is the position after the last batch returned.
    """

    def __init__(self, streams: list[SegmentStream | None], probs: np.ndarray, batch_size: int, seed: int) -> None:
        self.probs = probs
        self.batch_size = batch_size
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._feeds = [None if st is None else _Feed(st) for st in streams]

    def sample(self) -> MixedBatch:
        """The next batch; ``batch.source`` holds each item's source index."""
        which = _draw_sources(self._rng, self.probs, self.batch_size)
        parts, items = [], []
        for s in np.unique(which).tolist():
            feed = self._feeds[s]
            assert feed is not None  # sources of probability 0 are never drawn
            hit = np.flatnonzero(which == s)
            parts += feed.take(len(hit))
            items.append(hit)
        order = np.argsort(np.concatenate(items), kind="stable")
        batch = cast(MixedBatch, MixedBatch.wrap(join_items(parts, order), parts[0].context_length))
        batch.source = which
        return batch

    def __iter__(self) -> Iterator[MixedBatch]:
        return self

    def __next__(self) -> MixedBatch:
        return self.sample()

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "probs": self.probs.tolist(),
            "rng": self._rng.bit_generator.state,
            "sources": [None if f is None else f.state() for f in self._feeds],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; one of a different concat stream raises ArgumentError naming what differs."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: not a concat stream state (format {STATE_FORMAT})")
        if state.get("probs") != self.probs.tolist():
            raise ArgumentError(
                f"state_dict: source probabilities {state.get('probs')} differ from {self.probs.tolist()}"
            )
        saved = state["sources"]
        for feed, st in zip(self._feeds, saved, strict=True):
            if feed is not None:
                feed.load(st)
        self.seed = int(state["seed"])
        self._rng = np.random.default_rng(self.seed)
        self._rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        """Stop every source stream's prefetch thread."""
        for feed in self._feeds:
            if feed is not None:
                feed.stream.close()

    def __enter__(self) -> ConcatStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ConcatStream({len(self._feeds)} sources, probs={self.probs.round(4).tolist()})"


def concat(datasets: Sequence[Dataset | DatasetView], weights: Sequence[float] | None = None) -> ConcatView:
    """One read-only view over datasets/views with the same schema (see :mod:`concat`).

    ``weights``: one non-negative weight per source; sampling draws each item
    from source ``s`` with probability ``weights[s] / sum(weights)``. None:
    in proportion to each source's size (uniform over the union). Schemas that
    differ raise :class:`SchemaError` naming the field.
    """
    return ConcatView(datasets, weights)
