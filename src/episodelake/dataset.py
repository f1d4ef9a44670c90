"""Dataset and DatasetView: the public face that ties schema, table, tensors, query and sampling.

A :class:`Dataset` is one root URL: the descriptor ``episodelake.json``, the
Delta episode table under ``episodes/`` and Zarr v3 tensors under
``tensors/<writer>/``. It is pinned to one table version (the latest at open,
or ``version=N``); ``refresh()`` moves it to the latest. Its own commits move
it forward, and reads commit first: every read, query and sampler goes through
:meth:`Dataset.snapshot`, which commits the episodes this object's writers
handed over and moves to its own newest version (read-your-writes). Other
processes see episodes once they are committed and they ``refresh()``. A
:class:`DatasetView` is a subset of one snapshot's episodes (from
``where()``/``select_episodes()``), pinned to that snapshot, on which every
read and sampling call works.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .core.episode import python_meta, rows_for
from .core.errors import ArgumentError, DatasetNotFoundError
from .core.schema import DatasetSchema, infer_schema
from .core.segments import Segment
from .core.spellings import Refused, backend_path, refuse, seed_episode
from .ops.copy import KEEP
from .ops.namespaces import Columns, Edit, Maintenance
from .read.collection import EpisodeCollection, selection
from .read.snapshot import ScanBase, Snapshot
from .storage.faults import storage_fault
from .storage.location import Location, resolve
from .storage.retention import Capacity, check_ids
from .storage.store import Store
from .write.bulk import append as bulk_append
from .write.bulk import check as bulk_check
from .write.commit import CommitSink
from .write.writer import EpisodeWriter, VectorEpisodeWriter

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from .core.quality import Check
    from .ops.namespaces import Quality
    from .read.changes import Changes
    from .read.query import SQLResult
    from .sampling.batch import Transitions
    from .sampling.options import Anchors, Shard, Strategy, Window
    from .sampling.samplers import Sampler
    from .sampling.segment_dataset import SegmentDataset
    from .sampling.stream import SegmentStream
    from .sampling.trajectories import TrajectoryStream

WRITER_OPTIONS = ("commit_episodes", "commit_bytes", "commit_seconds")


class EpisodeRef:
    """One committed episode of a snapshot: ``read()`` gives its transitions."""

    def __init__(self, snap: Snapshot, pos: int) -> None:
        self._snap = snap
        self.position = pos

    @property
    def episode_id(self) -> int:
        return int(self._snap.index["episode_id"][self.position])

    @property
    def length(self) -> int:
        return int(self._snap.lengths[self.position])

    @property
    def terminated(self) -> bool:
        return bool(self._snap.index["terminated"][self.position])

    @property
    def truncated(self) -> bool:
        return bool(self._snap.index["truncated"][self.position])

    @property
    def meta(self) -> dict[str, Any]:
        """The episode's meta values as Python scalars (None: unset); shaped fields as arrays of their dtype."""
        return {k: python_meta(v) for k, v in self._snap.meta(self.position).items()}

    def read(self, start: int = 0, stop: int | None = None, *, fields: None = None) -> Segment:
        """Transitions ``[start, stop)`` as a Segment (obs/next_obs share one buffer).

        ``fields``: episodata's field selection; only None (every field) is taken.
        """
        if fields is not None:
            raise ArgumentError(
                f"read: fields={fields!r} is not taken: a segment holds every field; drop fields= and read the ones "
                "you need (seg.obs['camera'], seg['observation/camera'])"
            )
        length = self.length
        stop = length if stop is None else stop
        for name, value in (("start", start), ("stop", stop)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"episode {self.episode_id}: {name} must be an int, got {value!r}")
        if not 0 <= start < stop <= length:
            raise IndexError(f"episode {self.episode_id}: range [{start}, {stop}) outside [0, {length})")
        snap = self._snap
        data = {
            f.key: snap.read_ranges(f, [self.position], [start], [rows_for(f, stop)])[0]
            for f in snap.schema.step_fields
        }
        flags = np.zeros(stop - start, dtype=bool)
        terminated, truncated = flags.copy(), flags.copy()
        if stop == length:
            terminated[-1] = self.terminated
            truncated[-1] = self.truncated
        return Segment(
            snap.schema,
            data,
            terminated,
            truncated,
            np.ones(stop - start, dtype=bool),
            self.meta,
            episode_id=self.episode_id,
            start=start,
        )

    def __len__(self) -> int:
        """Transitions in the episode (:attr:`length`)."""
        return self.length

    # episodata's episode attributes: refused with what to write instead (:mod:`.core.spellings`)
    id, segment, step, ongoing, writer = (Refused("EpisodeRef") for _ in range(5))

    def __repr__(self) -> str:
        return f"EpisodeRef(id={self.episode_id}, length={self.length})"


class CollectionReads:
    """The read and sampling methods Dataset and DatasetView share, over a snapshot and a position subset.

    Subclasses give ``schema``, ``snapshot()`` and ``_origin``; with these
    methods they satisfy the :class:`~episodelake.read.collection.EpisodeCollection`
    contract the readers below the façade take.
    """

    _positions: np.ndarray | None  # None: all episodes of the snapshot

    @property
    def schema(self) -> DatasetSchema:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    @property
    def _origin(self) -> Dataset:
        """The dataset these episodes belong to (a view's dataset, or the dataset itself)."""
        raise NotImplementedError

    @property
    def info(self) -> dict[str, Any]:
        """The descriptor's ``info`` of the dataset these episodes belong to."""
        return self._origin.info

    def _view(self, snap: Snapshot, positions: np.ndarray) -> DatasetView:
        """A view of ``snap``'s episodes at ``positions``, belonging to this collection's dataset."""
        return DatasetView(self._origin, snap, positions)

    @property
    def positions(self) -> np.ndarray:
        """Snapshot positions of this collection's episodes, in episode order."""
        if self._positions is None:
            return np.arange(self.snapshot().num_episodes)
        return self._positions

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def num_steps(self) -> int:
        return int(self.snapshot().lengths[self.positions].sum())

    def episode(self, i: int | None = None, *, id: int | None = None) -> EpisodeRef:
        """The ``i``-th episode (negative indices count from the end), or the one whose episode id is ``id``.

        Exactly one of ``i`` and ``id`` (:class:`ArgumentError` otherwise); an
        index out of range raises IndexError, an id not among these episodes KeyError.
        """
        if (i is None) == (id is None):
            raise ArgumentError("episode takes a position i or id=, exactly one of them")
        if id is not None:
            return self._episode_by_id(id)
        n = len(self)
        if not isinstance(i, int | np.integer) or isinstance(i, bool):
            raise TypeError(f"episode index must be an int, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"episode index {i} out of range for {n} episodes")
        return EpisodeRef(self.snapshot(), int(self.positions[i]))

    def _episode_by_id(self, episode_id: int) -> EpisodeRef:
        snap = self.snapshot()
        try:
            pos = int(snap.positions_of(np.array([episode_id]))[0])
        except KeyError:
            raise KeyError(f"no episode with id {episode_id}") from None
        if self._positions is not None and not np.isin(pos, self._positions):
            raise KeyError(f"no episode with id {episode_id}")
        return EpisodeRef(snap, pos)

    def episodes(self) -> Iterator[EpisodeRef]:
        snap = self.snapshot()
        for pos in self.positions:
            yield EpisodeRef(snap, int(pos))

    @property
    def episode_ids(self) -> np.ndarray:
        return self.snapshot().index["episode_id"][self.positions]

    # ---- query (query.py)
    def sql(self, query: str, params: Any = None, sandbox: bool = False) -> SQLResult | None:
        """Run SQL over the views ``episodes`` and ``steps`` of this collection.

        Returns a lazy :class:`~episodelake.query.SQLResult` (None for a statement
        without a result); ``params`` fills ``?``/``$name`` placeholders;
        ``sandbox=True`` for untrusted text: one SELECT reading nothing but the views.
        """
        from .read.query import run_sql

        return run_sql(self, query, params, sandbox)

    def where(self, predicate: str, params: Any = None) -> DatasetView:
        """Episodes matching a SQL predicate over the ``episodes`` view; ``params`` binds its ``?``/``$name``."""
        from .read.query import where

        return self._chosen(self._view(*where(self, predicate, params)), "where", predicate, params)

    def select_episodes(self, query: str, params: Any = None) -> DatasetView:
        """Episodes whose ``episode_id`` a SQL query returns; ``params`` binds its ``?``/``$name``."""
        from .read.query import select_episodes

        return self._chosen(self._view(*select_episodes(self, query, params)), "select_episodes", query, params)

    def _chosen(self, view: DatasetView, step: str, sql: str, params: Any) -> DatasetView:
        """``view`` with its lineage: this collection's selection steps, then ``step`` (stream lineage)."""
        steps = selection(self, view.snapshot())
        if steps is not None:
            view.selection = (*steps, {step: sql, "params": params})
        return view

    def stats(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """Mean/std/min/max per numeric field (and return/length), from the commit-time statistics."""
        from .read.query import stats

        return stats(self, fields)

    # ---- sampling (segment_dataset.py, stream.py, transitions.py; options: options.py)
    def segments(
        self,
        window: Window | int | None = None,
        *,
        where: str | None = None,
        filter: Callable[[EpisodeRef], bool] | None = None,
        shard: Shard | Sequence[int] | None = None,
        transform: Mapping[str, Any] | None = None,
        **spellings: Any,
    ) -> SegmentDataset:
        """Map-style dataset of fixed-length segments (PyTorch DataLoader ready).

        ``window``: an ``el.Window`` (length, ``pad``: ``"suffix"``,
        ``"prefix"`` or None to skip short episodes; ``stride``: distance
        between segment starts) or an int length; ``where`` (SQL predicate)
        and ``filter`` (callable on each :class:`EpisodeRef`) narrow the
        episodes; ``shard``: ``(rank, world)`` or an ``el.Shard``, this rank's
        disjoint part; ``transform``: per field key, a
        :class:`~episodelake.transforms.FrameTransform` (crop/resize/normalize/layout
        on decode) or a callable on the batch array. See
        :class:`segment_dataset.SegmentDataset`. ``spellings``: episodata's
        keywords (``sequence_length=``, ``context_length=``/``target_length=``,
        ``pad=``), the same window (see :func:`~episodelake.sampling.spellings.spelled`).
        """
        from .sampling.segment_dataset import SegmentDataset
        from .sampling.spellings import spelled

        window, _ = spelled("segments", window, None, spellings)
        return SegmentDataset(self, window, where=where, filter=filter, shard=shard, transform=transform)

    def segment_stream(
        self,
        window: Window | int | None = None,
        *,
        batch_size: int = 64,
        sampler: Strategy | Sampler | None = None,
        seed: int | None = None,
        where: str | None = None,
        filter: Callable[[EpisodeRef], bool] | None = None,
        shard: Shard | Sequence[int] | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
        follow: bool = False,
        transform: Mapping[str, Any] | None = None,
        anchors: Anchors | None = None,
        **spellings: Any,
    ) -> SegmentStream:
        """The training stream of segment batches (``el.Batch``); every argument: :class:`stream.SegmentStream`.

        ``window``: an int length or an ``el.Window`` (context + target,
        pad, stride). ``sampler``: ``el.Uniform()`` (default: infinite, with
        replacement), ``el.Uniform(replacement=False)`` or ``el.Sequential()``
        (finite passes), ``el.Weighted(weights)``,
        ``el.Prioritized(priority, alpha, beta)`` (prioritized replay, with
        ``stream.update_priorities``) or a Sampler object; ``shard``:
        ``(rank, world)`` or ``el.Shard(rank, world, policy)``;
        ``follow=True`` takes in newly committed episodes before each batch
        (``stream.refresh()``); ``transform=`` per field: see :meth:`segments`;
        ``anchors=el.Anchors(predicate, offset)``: the segments positioned on
        the steps a SQL predicate over ``steps`` picks, one per anchor.
        ``spellings``: episodata's keywords (``sequence_length=``,
        ``context_length=``/``target_length=``, ``pad=``, ``shuffle=``, ...),
        translated into the same window and sampler by
        :func:`~episodelake.sampling.spellings.spelled`.
        """
        from .sampling.spellings import spelled
        from .sampling.stream import SegmentStream

        window, sampler = spelled("segment_stream", window, sampler, spellings)

        return SegmentStream(
            self,
            window,
            batch_size=batch_size,
            sampler=sampler,
            seed=seed,
            where=where,
            filter=filter,
            shard=shard,
            prefetch=prefetch,
            drop_last=drop_last,
            follow=follow,
            transform=transform,
            anchors=anchors,
        )

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
        sampler: Strategy | Sampler | None = None,
        where: str | None = None,
        filter: Callable[[EpisodeRef], bool] | None = None,
        transform: Mapping[str, Any] | None = None,
        anchors: Anchors | None = None,
        **spellings: Any,
    ) -> Transitions:
        """``batch_size`` single transitions (time axis removed), uniform with replacement by default.

        ``n_step``/``gamma``: n-step returns; ``history``/``horizon``: stacked
        observations before and after; ``rng`` (a ``np.random.Generator``)
        gives a reproducible sequence of calls, ``seed`` one deterministic call.
        ``sampler``: ``el.Uniform()`` (default), ``el.Weighted(weights)``,
        ``el.Prioritized(priority, alpha, beta)`` or a Sampler object; keep
        an ``el.PrioritizedSampler`` as ``sampler=`` to update priorities
        across calls; ``transform=`` per field: see :meth:`segments`;
        ``anchors=el.Anchors(predicate, offset)``: only the transitions
        ``offset`` steps from the steps the predicate picks. See
        :func:`transitions.sample_transitions`. ``spellings``: episodata's
        ``fields=None`` (see :func:`~episodelake.sampling.spellings.spelled`).
        """
        from .sampling.spellings import spelled
        from .sampling.transitions import sample_transitions

        spelled("sample_transitions", None, sampler, spellings)

        return sample_transitions(
            self,
            batch_size,
            n_step=n_step,
            gamma=gamma,
            history=history,
            horizon=horizon,
            seed=seed,
            rng=rng,
            sampler=sampler,
            where=where,
            filter=filter,
            transform=transform,
            anchors=anchors,
        )

    # ---- whole episodes (trajectories.py)
    def to_numpy(self, pad: bool = False) -> dict[str, np.ndarray]:
        """Every episode of this collection as NumPy arrays (tensor fields too: it reads everything).

        ``pad=False``: each step field's rows of all episodes concatenated, with
        ``offsets``/``obs_offsets`` ``[N + 1]`` (observations hold ``T + 1``
        rows per episode); ``pad=True``: ``[N, Lmax(+1), ...]`` padded with
        zeros plus ``mask``. Both add ``episode_id``, ``length``,
        ``terminated``, ``truncated``, ``meta/<name>`` and ``meta_mask/<name>``
        per episode. See :func:`trajectories.to_numpy`.
        """
        from .sampling.trajectories import to_numpy

        return to_numpy(self.snapshot(), self.positions, pad=bool(pad))

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
        """Batches of whole episodes padded to the longest in the batch, with ``mask`` and ``lengths``.

        ``sampler``: ``el.Uniform()`` (default: infinite, with replacement),
        ``el.Uniform(replacement=False)`` or ``el.Sequential()`` (finite
        passes); ``state_dict()`` resumes. See
        :class:`trajectories.TrajectoryStream`.
        """
        from .read.selection import select
        from .sampling.trajectories import TrajectoryStream

        snap, positions = select(self, where, filter)
        return TrajectoryStream(
            self.schema,
            [(snap, positions)],
            batch_size,
            seed=seed,
            sampler=sampler,
            drop_last=drop_last,
            pad_value=pad_value,
        )

    # ---- copying (copy.py)
    def copy_to(
        self,
        dest: str | None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        chunk_rows: int | Mapping[str, int] | None = KEEP,
        compression: str | Mapping[str, str | None] | None = KEEP,
        codecs: Mapping[str, str | tuple[str, int] | None] = KEEP,
        capacity: Capacity | int | Mapping[str, Any] | None = KEEP,
        checks: Iterable[Check] = KEEP,
        partition_by: Iterable[str] = KEEP,
        overwrite: bool = False,
        progress: bool | None = None,
        verify: bool = True,
        batch_bytes: int = 256 << 20,
        backend: str | None = None,
        **backend_options: Any,
    ) -> Dataset:
        """Copy these episodes to ``dest`` (None: memory; disk or object storage), verified.

        ``chunk_rows``/``compression`` re-chunk or re-compress every tensor
        field, or per field key as a mapping (omitted: as the source has it);
        ``codecs`` re-encodes fields with frame codecs (``{"observation/camera":
        ("jpeg", 90)}``, ``"jpegxl-lossless"``: exact; ``None``: raw or ``compression``). See :func:`copy.copy_to`.
        Every other dataset-level setting is carried too unless given:
        ``capacity`` (``None``: none; a copy larger than it keeps the newest
        episodes that fit), ``checks`` (the stored quality checks; ``()``:
        none; given ones are bound over the views first), ``partition_by``,
        ``info`` and the derived columns.
        ``backend``: episodata's ``"memory"`` or ``"zarr"``; ``backend_options``: refused (see
        :func:`~episodelake.core.spellings.backend_path`).
        """
        from .ops.copy import copy_to

        dest = backend_path(dest, backend, "copy_to", backend_options)
        if checks is not KEEP:
            from .ops.namespaces import bound_checks

            checks = bound_checks(self, checks)
        copied = copy_to(
            self._origin._store,
            self.snapshot(),
            self.positions,
            resolve(dest, dict(storage_options or {})),
            chunk_rows=chunk_rows,
            compression=compression,
            codecs=codecs,
            capacity=capacity if capacity is KEEP else Capacity.parse(capacity),
            checks=checks,
            partition_by=partition_by if partition_by is KEEP else list(partition_by),
            overwrite=overwrite,
            progress=progress,
            verify=verify,
            batch_bytes=batch_bytes,
        )
        return Dataset(copied)

    # ---- Ray Data (ray_data.py)
    def to_ray(
        self,
        where: str | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        tensors: Sequence[str] = (),
        concurrency: int = 1,
    ) -> Any:
        """These episodes as a ``ray.data.Dataset``, one row per episode (see :func:`ray_data.episodes_to_ray`).

        ``version`` reads that table version of a Dataset (None: the pinned
        one; a view is pinned, so only its own version is accepted).
        """
        from .sampling.ray_data import episodes_to_ray

        collection: EpisodeCollection = self
        if version is not None and version != self.snapshot().version:
            if self._positions is not None:
                raise ArgumentError(f"version: a view is pinned to version {self.snapshot().version}, got {version}")
            loc = self._origin.location
            collection = Dataset.open(loc.url, version, storage_options=loc.storage_options, read_only=True)
        return episodes_to_ray(collection, where, columns, tensors, concurrency)

    def segments_to_ray(
        self,
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
    ) -> Any:
        """This rank's segment batches of one pass as an ordered ``ray.data.Dataset``.

        The same batches as :meth:`segment_stream` with the same ``window``,
        ``sampler`` (``el.Uniform(replacement=False)``, the default, or
        ``el.Sequential()``) and ``shard``; ``epoch``, ``start_batch`` (resume
        after that many global batches), ``where``, ``drop_last``,
        ``concurrency``: see :func:`ray_data.segments_to_ray`.
        """
        from .sampling.ray_data import segments_to_ray

        return segments_to_ray(
            self,
            window,
            batch_size=batch_size,
            seed=seed,
            sampler=sampler,
            shard=shard,
            epoch=epoch,
            start_batch=start_batch,
            where=where,
            drop_last=drop_last,
            concurrency=concurrency,
        )


class DatasetView(CollectionReads):
    """A subset of one snapshot's episodes. Views compose (``view.where(...)``).

    ``selection``: the ``where``/``select_episodes`` steps (with their params)
    that chose the view from its dataset, recorded for stream lineage; None
    when it was chosen otherwise.
    """

    def __init__(self, dataset: Dataset, snap: Snapshot, positions: np.ndarray) -> None:
        self.dataset = dataset
        self._snap = snap
        self._positions = np.asarray(positions, dtype=np.int64)
        self.selection: tuple[dict[str, Any], ...] | None = None  # until where()/select_episodes() record theirs

    @property
    def schema(self) -> DatasetSchema:
        return self._snap.schema

    def snapshot(self) -> Snapshot:
        return self._snap

    @property
    def _origin(self) -> Dataset:
        return self.dataset

    @property
    def version(self) -> int:
        return self._snap.version

    def __repr__(self) -> str:
        return f"DatasetView({len(self)} of {self._snap.num_episodes} episodes, version {self.version})"


class Dataset(CollectionReads):
    """An episode dataset at one root (memory, local disk or object storage).

    The everyday verbs (write, read, query, sample, delete) are methods; the
    audit, vacuum and compaction live under :attr:`maintenance`, derived
    columns under :attr:`columns`.
    """

    _positions = None
    _verify = False  # check tensor CRC-32s on read (Dataset.open(..., verify=True))

    def __init__(self, store: Store, writer_options: Mapping[str, Any] | None = None) -> None:
        """A dataset over an opened :class:`~episodelake.store.Store` (use :meth:`create` or :meth:`open`)."""
        self._store = store
        self._writer_options = dict(writer_options or {})
        self._sink: CommitSink | None = None
        self._snap: Snapshot | None = None
        self._scan_base: ScanBase | None = None  # what the snapshot a commit replaced leaves the next one
        store.on_commit(self._on_commit)
        if store.capacity is not None and store.location.is_local and not store.read_only:
            from .ops.maintenance import AutoVacuum

            self._auto_vacuum = AutoVacuum(store)  # reclaims evicted tensors every capacity.vacuum_every commits

    @property
    def location(self) -> Location:
        return self._store.location

    @cached_property
    def maintenance(self) -> Maintenance:
        """The audit, vacuum and compaction verbs, the descriptor and ``read_only`` (see :class:`Maintenance`)."""
        return Maintenance(self, self._store)

    @cached_property
    def edit(self) -> Edit:
        """Row edits: ``edit.trim(...)``, ``edit.split(id, at)``, ``edit.set_meta(values, ...)`` (see :class:`Edit`)."""
        return Edit(self, self._store)

    @cached_property
    def columns(self) -> Columns:
        """Derived columns: ``columns.add(*specs)``, ``columns.update(values, ...)`` (see :class:`Columns`)."""
        return Columns(self, self._store)

    @cached_property
    def quality(self) -> Quality:
        """Quality checks and audits: ``quality.add(*checks)``, ``drop``, ``list``, ``check``; quarantined
        episodes: ``quality.quarantine()``, ``quality.release(ids)`` (see :class:`Quality`)."""
        from .ops.namespaces import Quality

        return Quality(self, self._store, self._view)

    @property
    def _origin(self) -> Dataset:
        return self

    def __getattr__(self, name: str) -> Any:
        """episodata's writer calls by episode id are refused with what to write instead (:mod:`.core.spellings`)."""
        refuse("Dataset", name)

    # ---- construction
    @classmethod
    def create(
        cls,
        schema: DatasetSchema,
        path: str | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        partition_by: Iterable[str] = (),
        overwrite: bool = False,
        durable: bool = False,
        info: Mapping[str, Any] | None = None,
        commit_episodes: int = 64,
        commit_bytes: int = 256 << 20,
        commit_seconds: float = 30.0,
        capacity: Capacity | int | Mapping[str, Any] | None = None,
        checks: Iterable[Check] = (),
        backend: str | None = None,
        **backend_options: Any,
    ) -> Dataset:
        """Create an empty dataset at ``path`` (None: in memory).

        ``path`` must be a new or empty folder, or hold a dataset, which
        ``overwrite=True`` replaces (else :class:`DatasetExistsError`). A file,
        or a folder holding anything else, is refused whatever ``overwrite``
        says, before anything is written (:func:`~episodelake.storage.store.check_target`).
        ``partition_by`` names meta fields to hive-partition the table by.
        ``durable=True`` fsyncs tensor writes (slower; protects against power
        loss, not only process crashes). The commit_* options bound how many
        finished episodes wait in memory before one table commit.
        ``capacity`` (an int of steps, a dict or :class:`Capacity`) makes a
        replay buffer: each commit evicts the oldest episodes beyond it in the
        same atomic commit (see docs/replay.md); stored with the dataset.
        Fields declared ``derived=True`` become derived columns (``columns.update``).
        ``checks`` (``el.Check``) are stored with the dataset (``quality``), each
        bound over the schema's views before anything is created.
        ``backend``: episodata's ``"memory"`` or ``"zarr"``; ``backend_options``
        (episodata's): refused (see :func:`~episodelake.core.spellings.backend_path`).
        """
        path = backend_path(path, backend, "create", backend_options)
        if checks:
            from .ops.namespaces import bound_checks

            checks = bound_checks(cls.create(schema), checks)  # an empty in-memory twin has the same views
        location = resolve(path, dict(storage_options or {}))
        try:
            store = Store.create(
                location,
                schema.base if isinstance(schema, DatasetSchema) else schema,
                partition_by=partition_by,
                overwrite=overwrite,
                durable=durable,
                info=info,
                capacity=Capacity.parse(capacity),
            )
        except Exception as exc:  # a full disk or a read-only root: StorageError, not deltalake's own words
            err = storage_fault(exc, dataset=location.url, object=location.url, doing="creating the dataset")
            if err is None:
                raise
            raise err from exc
        if schema.derived_fields:
            from .write.derived import declare

            declare(store, store.schema, schema.derived_fields)
        if checks:
            from .core.quality import with_added
            from .write.quality import record_checks

            record_checks(store, lambda current: with_added(current, checks), "ADD CHECK")
        return cls(
            store,
            writer_options={
                "commit_episodes": commit_episodes,
                "commit_bytes": commit_bytes,
                "commit_seconds": commit_seconds,
            },
        )

    @classmethod
    def open(
        cls,
        path: str,
        version: int | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        read_only: bool = False,
        verify: bool = False,
        cache_bytes: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        commit_episodes: int = 64,
        commit_bytes: int = 256 << 20,
        commit_seconds: float = 30.0,
        backend: str | None = None,
        **unknown: Any,
    ) -> Dataset:
        """Open a dataset; ``version=N`` opens that table version (time travel, read-only).

        ``read_only=True`` writes nothing, ever. ``verify=True`` checks each
        episode's tensor rows against their stored CRC-32 on first read
        (:class:`CorruptionError` on mismatch); ``maintenance.validate()`` audits everything.
        ``cache_bytes`` > 0 keeps up to that many bytes of tensor chunks
        (and shard indexes) in memory, so repeated reads from object storage
        issue no GET (see docs/object-storage.md). ``cache_dir`` (object
        stores) caches them on disk instead, shared by every process of the
        node, bounded by ``cache_bytes`` (default 10 GiB). The commit_* options are
        :meth:`create`'s, for the episodes this object writes. ``backend``:
        episodata's ``"memory"`` or ``"zarr"``, checked against ``path``. Any
        other keyword raises :class:`ArgumentError`.
        """
        path = backend_path(path, backend, "open")
        if unknown:
            raise ArgumentError(f"unknown option(s) {sorted(unknown)}; writer options are {list(WRITER_OPTIONS)}")
        writer_options = {
            "commit_episodes": commit_episodes,
            "commit_bytes": commit_bytes,
            "commit_seconds": commit_seconds,
        }
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ArgumentError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
            raise ArgumentError(f"cache_dir must be a directory path, got {cache_dir!r}")
        location = resolve(path, dict(storage_options or {}))
        try:
            store = Store.open(
                location,
                version,
                read_only=read_only,
                cache_bytes=cache_bytes,
                cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            )
        except DatasetNotFoundError:
            if location.protocol == "file" and os.path.isfile(os.path.join(location.path, "manifest.json")):
                raise DatasetNotFoundError(
                    f"{location.url} is an episodata dataset (manifest.json), not an episodelake one; import it once: "
                    "episodelake.importers.episodata.load(path, dest), or `episodelake import episodata path dest`"
                ) from None
            raise
        ds = cls(store, writer_options=writer_options)
        ds._verify = verify
        return ds

    @classmethod
    def from_episodes(
        cls,
        episodes: Iterable[Mapping[str, Any]] | Mapping[str, Any],
        path: str | None = None,
        schema: DatasetSchema | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        partition_by: Iterable[str] = (),
        overwrite: bool = False,
        durable: bool = False,
        info: Mapping[str, Any] | None = None,
        commit_episodes: int = 64,
        commit_bytes: int = 256 << 20,
        commit_seconds: float = 30.0,
        lengths: ArrayLike | None = None,
        checks: Iterable[Check] = (),
        backend: str | None = None,
        alignment: str | None = None,
        **backend_options: Any,
    ) -> Dataset:
        """Create a dataset from dict-form episodes (or columns with ``lengths``) and commit them.

        Each episode: ``initial_observation`` (reset observation) and
        ``observations`` ``[T, ...]`` (or ``observations`` ``[T + 1, ...]``
        alone), ``actions`` ``[T, ...]``, ``rewards`` ``[T]``, optional
        ``extras``, ``terminated``/``truncated`` (bool, or bool[T] set only on
        the last step) and ``meta`` (dict). Roles may be nested dicts. The
        schema is inferred from the first episode unless given. The keyword
        options are :meth:`create`'s (``checks`` too: the episodes given pass
        them at commit); ``lengths``: see :meth:`append_episodes`.
        Bulk: one commit per large batch (see :mod:`bulk`). episodata's
        spellings: ``backend`` (``"memory"`` or ``"zarr"``), a schema given
        second (``from_episodes(episodes, schema)``), its episode keys
        (``final_observation``, ``infos`` with ``initial_info``/``final_info``)
        and ``alignment`` (see :func:`~episodelake.core.spellings.seed_episode`).
        """
        backend_path(None, None, "from_episodes", backend_options)
        if isinstance(path, DatasetSchema):  # episodata's order: from_episodes(episodes, schema, path)
            path, schema = cast(Any, schema), path
        if lengths is not None:
            if not isinstance(episodes, Mapping):
                raise ArgumentError("with lengths=, from_episodes takes one mapping of concatenated columns")
            meta = episodes.get("meta") or {}
            first: Mapping[str, Any] | None = {**episodes, "meta": {k: v[0] for k, v in meta.items() if len(v)}}
            it: Iterator[Mapping[str, Any]] = iter(())
        else:
            it = (seed_episode(e, alignment) for e in episodes)  # type: ignore[arg-type]  # dicts, no lengths=
            first = next(it, None)
        if schema is None:
            if first is None:
                raise ArgumentError("cannot infer a schema from zero episodes; pass schema=")
            schema = infer_schema(first)
        ds = cls.create(
            schema,
            path,
            backend=backend,
            storage_options=storage_options,
            partition_by=partition_by,
            overwrite=overwrite,
            durable=durable,
            info=info,
            commit_episodes=commit_episodes,
            commit_bytes=commit_bytes,
            commit_seconds=commit_seconds,
            checks=checks,
        )
        if lengths is not None:
            ds.append_episodes(episodes, lengths=lengths)
        elif first is not None:
            # one call: a rejected episode withdraws the pending ones and is named by its index
            ds.append_episodes(itertools.chain([first], it))
        ds.flush()
        return ds

    # ---- writing
    def _writer(self) -> CommitSink:
        self._store.check_writable()
        sink = self._sink
        stale = sink is not None and sink.schema is not self._store.schema and not (sink.pending or sink.awaiting)
        if sink is None or sink.pid != os.getpid() or stale:
            # A forked child writes under its own writer id; the parent's pending episodes stay the parent's.
            # After a schema edit (ds.columns.drop/rename), an idle sink gives way to one of the new schema.
            sink = self._sink = CommitSink(self._store, **self._writer_options)
        return sink

    def new_episode(self, initial_obs: Any = None, infos: Any = None, **meta: Any) -> EpisodeWriter:
        """Start recording an episode at its reset observation; ``meta`` are meta fields.

        episodata's spellings: ``observations=`` is ``initial_obs``; ``infos``
        (the reset's info) is taken and not stored: the reset has no
        transition for it to belong to (each step's infos are stored as
        extras). Without a reset observation, :class:`ArgumentError`.
        """
        names = {f.name for f in self.schema.meta_fields}
        if infos is not None and "infos" in names:  # a meta field of that name
            meta["infos"], infos = infos, None
        if initial_obs is None and "observations" in meta and "observations" not in names:
            initial_obs = meta.pop("observations")
        if initial_obs is None:
            raise ArgumentError(
                "new_episode needs the reset observation: ds.new_episode(obs) with obs, info = env.reset(); "
                "for action-out data (episodata's ActionOutWriter) write whole episodes with final_observation "
                "through ds.append_episodes"
            )
        if infos is not None and not isinstance(infos, Mapping):
            raise ArgumentError(f"new_episode: infos must be the reset's info dict, got {type(infos).__name__}")
        return EpisodeWriter(self._writer(), initial_obs, meta)

    def vector_writer(
        self,
        initial_obs: Any = None,
        num_envs: int | None = None,
        autoreset_mode: str = "next_step",
        meta: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
    ) -> VectorEpisodeWriter:
        """A writer for ``num_envs`` parallel envs (see :class:`VectorEpisodeWriter`).

        Both ``initial_obs`` (the reset observations, ``[num_envs, ...]``) and
        ``num_envs`` are needed; episodata's ``vector_writer(num_envs)`` then
        ``writer.reset(obs)`` is an :class:`ArgumentError` saying so.
        """
        if initial_obs is None or num_envs is None:
            raise ArgumentError(
                "vector_writer takes the reset observations and the number of envs: ds.vector_writer(obs, num_envs) "
                "with obs, infos = envs.reset(); then writer.add_steps(obs, actions, rewards, terminated, truncated) "
                "per envs.step (episodata's writer.reset(obs)/writer.step(...))"
            )
        return VectorEpisodeWriter(self._writer(), initial_obs, num_envs, autoreset_mode, meta)

    def append_episodes(
        self,
        episodes: Iterable[Mapping[str, Any]] | Mapping[str, Any],
        *,
        lengths: ArrayLike | None = None,
        dry_run: bool = False,
    ) -> int:
        """Validate and append episodes in bulk; returns how many.

        ``episodes``: dict-form episodes (see :meth:`from_episodes`), or with
        ``lengths`` (one int per episode: its transitions ``T``) one mapping of
        every episode's rows concatenated: ``observations`` ``[sum(T + 1), ...]``,
        ``actions``/``rewards``/``extras`` ``[sum(T), ...]``,
        ``terminated``/``truncated`` (one bool, or one per episode) and ``meta``
        (field -> one value per episode, None for NULL). Validated and summarized
        many episodes per NumPy call and committed in large, size-bounded batches
        (one commit each; see :mod:`episodelake.bulk`). A rejected episode raises
        :class:`ValidationError` naming its index and field; with ``lengths``
        nothing is written then. ``dry_run=True`` validates the same way and
        writes nothing (a read-only dataset too); it returns how many episodes
        would be appended.
        """
        if lengths is None and not isinstance(episodes, Mapping):
            episodes = map(seed_episode, episodes)  # episodata's episode keys (action-out, infos)
        if dry_run:
            return bulk_check(self.schema, episodes, lengths)
        return bulk_append(self._writer(), episodes, lengths)

    def flush(self, *, discard: bool = False) -> int | None:
        """Commit pending finished episodes now; returns the new version (None if none).

        Raises :class:`ValidationError` naming the fields, and commits nothing,
        while an ended episode still waits for ``required`` meta.
        ``discard=True`` commits nothing: it drops this object's finished but
        uncommitted episodes, held ones included (they are never committed,
        not at exit either), and returns how many it dropped (0 if none).
        """
        if self._sink is None:
            return 0 if discard else None
        return self._sink.discard() if discard else self._sink.flush()

    def close(self) -> None:
        """:meth:`flush` (the dataset stays usable; reads need no close)."""
        self.flush()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- deleting (retention.py)
    def delete(
        self,
        episode_ids: Iterable[int] | None = None,
        *,
        where: str | None = None,
        params: Any = None,
        all: bool = False,
    ) -> int:
        """Remove episodes in one commit: ``episode_ids``, those matching ``where`` (SQL over ``episodes``), or ``all``.

        Exactly one of ``episode_ids``, ``where=`` and ``all=True``. Returns
        how many were removed (0: no commit). Unknown ids raise
        :class:`ArgumentError`, a bad predicate :class:`QueryError`; nothing
        changes then. Older versions (time travel, readers pinned to them)
        keep the episodes until ``maintenance.vacuum`` removes their files.
        """
        self._store.check_writable()
        if not isinstance(all, bool) or (episode_ids is not None) + (where is not None) + all != 1:
            raise ArgumentError("delete takes episode_ids, where= or all=True, exactly one of them")
        if where is None and params is not None:
            raise ArgumentError("delete: params= fills placeholders of where=; give where= too")
        if all:
            n = len(self.snapshot().index["episode_id"])
            if n:
                self._store.clear()
            return n
        snap = self.snapshot()
        if where is not None:
            if not isinstance(where, str):
                raise ArgumentError(f"delete: where must be a SQL predicate string, got {type(where).__name__}")
            found = self.sql(f"SELECT episode_id FROM episodes WHERE ({where})", params, sandbox=True)
            assert found is not None  # a sandboxed statement is one SELECT
            ids = found.fetchnumpy()["episode_id"]
        else:
            assert episode_ids is not None
            ids = check_ids(episode_ids)
            unknown = ids[~np.isin(ids, snap.index["episode_id"])]
            if len(unknown):  # quarantined episodes are deleted like the others
                unknown = unknown[~np.isin(unknown, self.quality.quarantine().snapshot().index["episode_id"])]
            if len(unknown):
                raise ArgumentError(
                    f"delete: {len(unknown)} episode id(s) not in version {snap.version}: {unknown[:10].tolist()}"
                )
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        if len(ids):
            self._store.delete(ids.tolist())
        return len(ids)

    def _on_commit(self) -> None:
        # a commit through the store moved the version: drop the old snapshot now, keep what the next one grows from
        self._scan_base, self._snap = (self._snap and self._snap.successor_base()) or self._scan_base, None

    # ---- versions
    @property
    def schema(self) -> DatasetSchema:
        return self._store.schema

    @property
    def version(self) -> int:
        return self._store.version

    def snapshot(self) -> Snapshot:
        """The snapshot every read uses: commits this object's handed-over episodes first (read-your-writes)."""
        sink = self._sink
        if sink is not None and sink.pending and sink.pid == os.getpid():
            sink.commit()
        return self._committed()

    def _committed(self) -> Snapshot:
        """The snapshot of the store's version, committing nothing."""
        if self._snap is None or self._snap.version != self._store.version:
            self._snap = Snapshot(self._store, (self._snap and self._snap.successor_base()) or self._scan_base)
            self._scan_base = None
            self._snap.verify = self._verify
        return self._snap

    def refresh(self) -> Dataset:
        """Move to the latest committed version (no-op at a pinned past version)."""
        self._store.refresh()
        return self

    def _follow(self, min_interval: float) -> Dataset:
        """:meth:`refresh` for a stream following commits: the log looked at no more than every ``min_interval`` s."""
        self._store.refresh(min_interval)
        return self

    def _unflushed(self, min_interval: float = 0.0) -> tuple[Snapshot, CommitSink | None]:
        """The latest committed version, committing nothing, and this process's writer (None: none).

        What a stream following this Dataset reads: the snapshot, and the
        writer whose finished, uncommitted episodes it samples too
        (``sampling.stream``), so a commit per finished episode stays off
        the sampling path. Other handles' commits are looked for as
        :meth:`_follow` does.
        """
        self._store.refresh(min_interval)
        sink = self._sink
        return self._committed(), sink if sink is not None and sink.pid == os.getpid() else None

    def history(self) -> list[dict[str, Any]]:
        """The table's commits, newest first (this object's finished episodes are committed first)."""
        self.snapshot()
        return self._store.table.history()

    def changes(self, since_version: int) -> Changes:
        """Episodes added, removed (deleted or evicted) and updated (derived columns) since ``since_version``.

        Compares this object's version with ``since_version`` (typically the
        ``version`` in a training run's stream state) through the table's
        data files, reading only the files that differ; see :mod:`.changes`.
        Returns sorted episode-id arrays ``added``, ``removed``, ``updated``.
        """
        from .read.changes import changes

        self.snapshot()  # read-your-writes: this object's finished episodes are committed first
        return changes(self._store, since_version)

    @cached_property
    def info(self) -> dict[str, Any]:
        return dict(self._store.descriptor.get("info", {}))

    def __repr__(self) -> str:
        return f"Dataset({self.location.url!r}, version={self.version}, episodes={len(self)})"


def merge(
    sources: Sequence[Dataset | DatasetView | str],
    dest: str | None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    where: str | None = None,
    params: Any = None,
    capacity: Capacity | int | Mapping[str, Any] | None = KEEP,
    checks: Iterable[Check] = KEEP,
    overwrite: bool = False,
    progress: bool | None = None,
    verify: bool = True,
    batch_bytes: int = 256 << 20,
) -> Dataset:
    """``el.merge``: every episode of ``sources`` (datasets, views or paths) in one new dataset at ``dest``, verified.

    ``dest``: None (memory), a path or an object-store URL (``storage_options``
    reach it; a path source is opened read-only with default options).
    ``where`` (``params`` bind it) keeps the matching episodes of each
    source. New unique ids; the meta columns ``source`` (the source's URL)
    and ``source_episode_id`` (the id there) say where each came from.
    Different fields raise :class:`SchemaError` naming the source and field.
    ``capacity``/``checks`` omitted: the sources' (the union of their stored
    checks; their capacity when all have the same, else :class:`ArgumentError`);
    given (``None`` / ``()``: none), they replace them.
    See :mod:`episodelake.ops.merge`.
    """
    from .ops.merge import merge as merge_into

    collections: list[EpisodeCollection] = []
    for source in sources:
        if isinstance(source, str | os.PathLike):
            source = Dataset.open(os.fspath(source), read_only=True)
        if not isinstance(source, CollectionReads):
            raise ArgumentError(f"merge: sources are datasets, views or paths, got {type(source).__name__}")
        collections.append(source.where(where, params) if where is not None else source)
    picked = [(c._origin._store, c.snapshot(), c.positions) for c in collections]  # type: ignore[attr-defined]
    target = resolve(dest, dict(storage_options or {}))
    if checks is not KEEP and collections:
        from .ops.namespaces import bound_checks

        checks = bound_checks(collections[0], checks)
    merged = merge_into(
        picked,
        target,
        capacity=capacity if capacity is KEEP else Capacity.parse(capacity),
        checks=checks,
        overwrite=overwrite,
        progress=progress,
        verify=verify,
        batch_bytes=batch_bytes,
    )
    return Dataset(merged)
