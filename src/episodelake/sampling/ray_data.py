"""Ray Data sources: the episode table of a pinned version, and the training stream's batches, as ``ray.data.Dataset``.

``ray`` is imported only when a function here is called (the ``ray`` extra).

* :func:`episodes_to_ray` (``ds.to_ray()``): one row per episode, read by
  Ray's Delta reader (``ray.data.read_delta``) at the collection's pinned
  version. ``where`` is evaluated by DuckDB on the driver (the same SQL, the
  same rows as ``ds.where``) and handed to Ray as an ``episode_id IN (...)``
  predicate, which Ray's optimizer pushes into the Parquet scan. Listed
  tensor fields are added by a pool of actors, each opening the snapshot once.
* :func:`segments_to_ray` (``ds.segments_to_ray()``): rank ``r``'s batches of
  one pass, planned on the driver by the local sampler's planner
  (:class:`~episodelake.stream.SegmentStream` with ``shard=(r, w)``), so batch
  ``k`` of rank ``r`` equals batch ``k`` of ``segment_stream(shard=(r, w))``
  with the same seed and epoch: global batch ``k`` holds ``batch_size * w``
  segments and rank ``r`` takes its round-robin slice. Order is preserved;
  ``start_batch`` resumes after a global batch counter. No
  ``streaming_split``: it routes blocks dynamically and has no state to resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..core.episode import rows_for
from ..core.errors import ArgumentError, MissingDependencyError
from ..read.collection import EpisodeCollection, subset
from ..read.snapshot import Snapshot
from ..storage import layout
from ..storage.location import resolve
from ..storage.store import Store
from .options import Shard, Strategy, Uniform, Window, sampler_of, window_of

if TYPE_CHECKING:
    import ray.data

ID = "episode_id"
RAY_SAMPLERS = ("passes", "sequential")  # a planned pass: finite, the same plan on every rank


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
        raise MissingDependencyError("Ray Data needs the ray extra: pip install 'episodelake[ray]'") from exc
    return ray


def _open_snapshot(url: str, storage_options: dict[str, Any], version: int) -> Snapshot:
    """The pinned snapshot, opened read-only in a Ray worker (once per actor)."""
    return Snapshot(Store.open(resolve(url, dict(storage_options)), version, read_only=True))


class _EpisodeTensors:
    """Ray actor: adds each listed tensor field's rows of every episode of a batch (one array per episode).

    Batches stay Arrow tables, so the table columns keep their exact types (timestamps keep their zone).
    """

    def __init__(self, url: str, storage_options: dict[str, Any], version: int, keys: Sequence[str], drop_id: bool):
        self.snap = _open_snapshot(url, storage_options, version)
        self.fields = [self.snap.schema[k] for k in keys]
        self.drop_id = drop_id

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ray.data.extensions import ArrowVariableShapedTensorArray

        pos = self.snap.positions_of(batch.column(ID).to_numpy())
        lengths = self.snap.lengths[pos]
        for f in self.fields:
            hi = [rows_for(f, int(n)) for n in lengths]
            column = np.empty(len(pos), dtype=object)
            column[:] = self.snap.read_ranges(f, pos.tolist(), [0] * len(pos), hi)
            batch = batch.append_column(f.key, ArrowVariableShapedTensorArray.from_numpy(column))
        return batch.drop_columns([ID]) if self.drop_id else batch


def _table_columns(snap: Snapshot) -> list[str]:
    return list(snap.arrow_dataset().schema.names)


def _check_names(what: str, names: Any, allowed: Sequence[str], hint: str) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ArgumentError(f"{what} must be a sequence of names, got {names!r}")
    for name in names:
        if name not in allowed:
            raise ArgumentError(f"{what}: {name!r} is not {hint}; choose from {list(allowed)}")
    return list(names)


def episodes_to_ray(
    collection: EpisodeCollection,
    where: str | None = None,
    columns: Sequence[str] | None = None,
    tensors: Sequence[str] = (),
    concurrency: int = 1,
) -> ray.data.Dataset:
    """The collection's episodes at its pinned version as a ``ray.data.Dataset``, one row per episode.

    Rows are the episode table's (storage encodings as in SQL: see
    docs/query.md), in no particular order; ``where`` (SQL over the
    ``episodes`` view) keeps the rows ``collection.where(where)`` keeps;
    ``columns`` projects table columns (derived columns are not in the table:
    read them with SQL); each ``tensors`` key adds a column holding the
    episode's rows of that tensor field (``[T + 1, *shape]`` for observations,
    ``[T, *shape]`` otherwise), read by ``concurrency`` actors.
    """
    ray = _ray()
    from ray.data.expressions import col

    snap = collection.snapshot()
    table_columns = _table_columns(snap)
    cols = None if columns is None else _check_names("columns", columns, table_columns, "an episode table column")
    keys = _check_names("tensors", tensors, [f.key for f in snap.schema.tensor_fields], "a tensor field")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ArgumentError(f"concurrency must be an int >= 1, got {concurrency!r}")
    chosen = collection.where(where) if where is not None else collection
    read = None if cols is None else cols + ([ID] if keys and ID not in cols else [])
    loc = snap.loc
    out = ray.data.read_delta(
        loc.delta_uri(),
        version=snap.version,
        storage_options=loc.delta_options(),
        filesystem=loc.arrow_filesystem(*layout.table_parts()),
        columns=read,
    )
    if subset(chosen, snap) is not None:
        out = out.filter(expr=col(ID).is_in(chosen.episode_ids.tolist()))
    if keys:
        out = out.map_batches(
            _EpisodeTensors,
            fn_constructor_args=(loc.url, loc.storage_options, snap.version, keys, cols is not None and ID not in cols),
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=concurrency),
        )
    return out


class _SegmentReader:
    """Ray actor: the segments of a planned batch (episode ids and first transitions) as NumPy columns."""

    def __init__(self, url: str, storage_options: dict[str, Any], version: int, length: int) -> None:
        from ..read.batching import reader_for

        self.snap = _open_snapshot(url, storage_options, version)
        self.reader = reader_for(self.snap)
        self.length = length

    def __call__(self, plan: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pos = self.snap.positions_of(plan[ID])
        seg = self.reader.segments(pos, plan["start"], self.length)
        return batch_columns(seg)


def batch_columns(seg: Any) -> dict[str, np.ndarray]:
    """A segment batch as the flat columns a Ray batch holds: :meth:`Segment.buffers`, ``episode_id``, ``start``."""
    out = dict(seg.buffers())
    out[ID], out["start"] = np.asarray(seg.episode_id), np.asarray(seg.start)
    return out


def plan_pass(
    collection: EpisodeCollection,
    window: Window | int,
    batch_size: int,
    seed: int,
    sampler: Strategy | None,
    shard: Shard | Sequence[int] | None,
    epoch: int,
    where: str | None,
    drop_last: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's batches of pass ``epoch`` as the local sampler plans them: (episode ids, first transitions)."""
    from .stream import SegmentStream

    strategy = sampler_of(sampler, "segments_to_ray", RAY_SAMPLERS, default=Uniform(replacement=False))
    stream = SegmentStream(
        collection,
        window,
        batch_size=batch_size,
        sampler=strategy,
        seed=seed,
        where=where,
        shard=shard,
        prefetch=0,
        drop_last=drop_last,
    )
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ArgumentError(f"epoch must be an int >= 0, got {epoch!r}")
    state = stream.state_dict()
    state["epoch"] = epoch
    stream.load_state_dict(state)
    planner = stream._planner  # the stream's own planner: the same ids its batches would hold, without reading them
    index, ids_of = stream.index, collection.snapshot().index[ID]
    out = []
    while (gid := planner.next_ids()) is not None:
        k, first = index.locate_global(gid)
        out.append((np.asarray(ids_of[index.positions[k]], np.int64), np.asarray(first, np.int64)))
    return out


def segments_to_ray(
    collection: EpisodeCollection,
    window: Window | int,
    *,
    batch_size: int,
    seed: int,
    sampler: Strategy | None = None,
    shard: Shard | Sequence[int] | None = None,
    epoch: int = 0,
    start_batch: int = 0,
    where: str | None = None,
    drop_last: bool = False,
    concurrency: int = 1,
) -> ray.data.Dataset:
    """This rank's segment batches of pass ``epoch`` from ``start_batch`` on, as an ordered ``ray.data.Dataset``.

    One row per segment, columns as :func:`batch_columns`; read it with
    ``iter_batches(batch_size=batch_size)``: batch ``j`` then equals batch
    ``start_batch + j`` of ``collection.segment_stream(window, sampler=...,
    shard=...)`` with the same arguments at the same epoch (every batch but a
    pass's last is full, so regrouping keeps the boundaries). ``sampler``:
    ``el.Uniform(replacement=False)`` (None: a seeded shuffled pass) or
    ``el.Sequential()``. ``shard``: ``(rank, world)`` or an ``el.Shard`` (its
    policy evens out the ranks). Every rank yields the same number of batches;
    to resume after ``k`` global batches pass ``start_batch=k`` on every rank.
    """
    ray = _ray()
    if isinstance(start_batch, bool) or not isinstance(start_batch, int) or start_batch < 0:
        raise ArgumentError(f"start_batch must be an int >= 0, got {start_batch!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ArgumentError(f"concurrency must be an int >= 1, got {concurrency!r}")
    plan = plan_pass(collection, window, batch_size, seed, sampler, shard, epoch, where, drop_last)
    if start_batch > len(plan):
        raise ArgumentError(f"start_batch={start_batch} is past the pass's {len(plan)} batches")
    # one block per batch: each actor call reads one whole batch, and several actors read batches side by side
    blocks = [pa.table({ID: ids, "start": first}) for ids, first in plan[start_batch:]]
    snap = collection.snapshot()
    out = ray.data.from_arrow(blocks or [pa.table({ID: pa.array([], pa.int64()), "start": pa.array([], pa.int64())})])
    out.context.execution_options.preserve_order = True
    return out.map_batches(
        _SegmentReader,
        fn_constructor_args=(snap.loc.url, snap.loc.storage_options, snap.version, window_of(window).size),
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=concurrency),
    )
