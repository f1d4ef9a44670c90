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
import json
import os
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from functools import cached_property
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as pkg_version
from typing import TYPE_CHECKING, Any

import numpy as np
from deltalake.exceptions import DeltaError

from .commit import CommitSink
from .errors import CorruptionError, DatasetNotFoundError, ReadOnlyError, SchemaError, ValidationError
from .location import Location, resolve
from .schema import DatasetSchema, infer_schema
from .segments import Segment
from .snapshot import Snapshot
from .table import EpisodeTable, arrow_schema
from .tensors import make_context
from .validation import episode_from_dict
from .writer import EpisodeWriter, VectorEpisodeWriter, write_episodes

if TYPE_CHECKING:
    from .maintenance import VacuumReport, ValidationReport

DESCRIPTOR = "episodelake.json"
WRITER_OPTIONS = ("commit_episodes", "commit_bytes", "commit_seconds")
FORMAT_VERSION = 1


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("episodelake", "numpy", "pyarrow", "deltalake", "tensorstore", "duckdb", "gymnasium"):
        try:
            out[pkg] = pkg_version(pkg)
        except PackageNotFoundError:
            continue
    return out


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
        return self._snap.meta(self.position)

    def read(self, start: int = 0, stop: int | None = None) -> Segment:
        """Transitions ``[start, stop)`` as a Segment (obs/next_obs share one buffer)."""
        length = self.length
        stop = length if stop is None else stop
        for name, value in (("start", start), ("stop", stop)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"episode {self.episode_id}: {name} must be an int, got {value!r}")
        if not 0 <= start < stop <= length:
            raise IndexError(f"episode {self.episode_id}: range [{start}, {stop}) outside [0, {length})")
        snap = self._snap
        data = {}
        for f in snap.schema.step_fields:
            extra = 1 if f.role == "observation" else 0
            data[f.key] = snap.read_ranges(f, [self.position], [start], [stop + extra])[0]
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

    def __repr__(self) -> str:
        return f"EpisodeRef(id={self.episode_id}, length={self.length})"


class EpisodeCollection:
    """Shared read API of Dataset and DatasetView over a snapshot and a position subset."""

    _positions: np.ndarray | None  # None: all episodes of the snapshot

    @property
    def schema(self) -> DatasetSchema:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

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

    def episode(self, i: int) -> EpisodeRef:
        """The ``i``-th episode (negative indices count from the end)."""
        n = len(self)
        if not isinstance(i, int | np.integer) or isinstance(i, bool):
            raise TypeError(f"episode index must be an int, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"episode index {i} out of range for {n} episodes")
        return EpisodeRef(self.snapshot(), int(self.positions[i]))

    def episode_by_id(self, episode_id: int) -> EpisodeRef:
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
    def sql(self, query: str, params: Any = None):
        """Run SQL over the views ``episodes`` and ``steps`` of this collection."""
        from .query import run_sql

        return run_sql(self, query, params)

    def sql_arrow(self, query: str, params: Any = None):
        """:meth:`sql` fetched as a ``pyarrow.Table``."""
        from .query import sql_arrow

        return sql_arrow(self, query, params)

    def sql_numpy(self, query: str, params: Any = None) -> dict[str, np.ndarray]:
        """:meth:`sql` fetched as NumPy columns (uniform list columns become array axes)."""
        from .query import sql_numpy

        return sql_numpy(self, query, params)

    def where(self, predicate: str) -> DatasetView:
        """Episodes matching a SQL predicate over the ``episodes`` view."""
        from .query import where

        return where(self, predicate)

    def select_episodes(self, query: str) -> DatasetView:
        """Episodes whose ``episode_id`` a SQL query returns."""
        from .query import select_episodes

        return select_episodes(self, query)

    def stats(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """Mean/std/min/max per numeric field (and return/length), from one SQL aggregate."""
        from .query import stats

        return stats(self, fields)

    # ---- sampling (sampling.py)
    def segments(self, sequence_length: int, **kwargs: Any):
        """Map-style dataset of fixed-length segments (PyTorch DataLoader ready)."""
        from .sampling import SegmentDataset

        return SegmentDataset(self, sequence_length, **kwargs)

    def segment_stream(self, **kwargs: Any):
        """The training stream of segment batches (see :class:`sampling.SegmentStream`)."""
        from .sampling import SegmentStream

        return SegmentStream(self, **kwargs)

    def sample_transitions(self, batch_size: int, **kwargs: Any):
        """Single transitions (time axis removed), with n-step returns on request."""
        from .sampling import sample_transitions

        return sample_transitions(self, batch_size, **kwargs)

    # ---- copying (copy.py)
    def copy_to(self, dest: str | None, storage_options: Mapping[str, Any] | None = None, **kwargs: Any) -> Dataset:
        """Copy these episodes to ``dest`` (memory, disk or object storage), verified; see :func:`copy.copy_to`."""
        from .copy import copy_to

        return copy_to(self, dest, storage_options, **kwargs)


class DatasetView(EpisodeCollection):
    """A subset of one snapshot's episodes. Views compose (``view.where(...)``)."""

    def __init__(self, dataset: Dataset, snap: Snapshot, positions: np.ndarray) -> None:
        self.dataset = dataset
        self._snap = snap
        self._positions = np.asarray(positions, dtype=np.int64)

    @property
    def schema(self) -> DatasetSchema:
        return self._snap.schema

    def snapshot(self) -> Snapshot:
        return self._snap

    @property
    def version(self) -> int:
        return self._snap.version

    def __repr__(self) -> str:
        return f"DatasetView({len(self)} of {self._snap.num_episodes} episodes, version {self.version})"


class Dataset(EpisodeCollection):
    """An episode dataset at one root (memory, local disk or object storage)."""

    _positions = None
    verify = False  # check tensor CRC-32s on read (Dataset.open(..., verify=True))

    def __init__(
        self,
        location: Location,
        descriptor: Mapping[str, Any],
        table: EpisodeTable,
        read_only: bool = False,
        durable: bool = False,
        writer_options: Mapping[str, Any] | None = None,
        pinned: bool = False,
    ) -> None:
        self.location = location
        self.descriptor = dict(descriptor)
        self._schema = DatasetSchema.from_json(descriptor["schema"])
        self._table = table
        self.read_only = read_only
        self._ts_context = make_context(durable=durable)
        self._writer_options = dict(writer_options or {})
        self._sink: CommitSink | None = None
        self._snap: Snapshot | None = None
        self._pinned = pinned

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
    ) -> Dataset:
        """Create an empty dataset at ``path`` (None: in memory).

        ``partition_by`` names meta fields to hive-partition the table by.
        ``durable=True`` fsyncs tensor writes (slower; protects against power
        loss, not only process crashes). The commit_* options bound how many
        finished episodes wait in memory before one table commit.
        """
        if not isinstance(schema, DatasetSchema):
            raise SchemaError(f"schema must be a DatasetSchema, got {type(schema).__name__}")
        loc = resolve(path, dict(storage_options or {}))
        parts = list(partition_by)
        meta_names = {f.name for f in schema.meta_fields}
        for p in parts:
            if p not in meta_names:
                raise SchemaError(f"partition_by {p!r} is not a meta field ({sorted(meta_names)})")
            if schema[p].shape != ():
                raise SchemaError(f"partition_by {p!r} must be a scalar meta field")
        if loc.exists(DESCRIPTOR):
            if not overwrite:
                raise FileExistsError(f"a dataset already exists at {loc.url}; pass overwrite=True to replace it")
            loc.fs.rm(loc.path, recursive=True)
        descriptor = {
            "format": "episodelake",
            "format_version": FORMAT_VERSION,
            "schema": schema.to_json(),
            "partition_by": parts,
            "tensor_layout": {"format": "zarr3", "sharded": not loc.is_local, "root": "tensors/<writer>/<key>"},
            "created_at": datetime.now(UTC).isoformat(),
            "info": dict(info or {}),
            "versions": _versions(),
        }
        table = EpisodeTable.create(loc, arrow_schema(schema), parts)
        # The descriptor is written last: its presence marks a complete dataset.
        loc.write_text_atomic(json.dumps(descriptor, indent=2), DESCRIPTOR)
        return cls(
            loc,
            descriptor,
            table,
            durable=durable,
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
        **writer_options: Any,
    ) -> Dataset:
        """Open a dataset; ``version=N`` opens that table version (time travel, read-only).

        ``read_only=True`` writes nothing, ever. ``verify=True`` checks each
        episode's tensor rows against their stored CRC-32 on first read
        (:class:`CorruptionError` on mismatch); ``validate()`` audits everything.
        ``cache_bytes`` > 0 keeps up to that many bytes of decoded tensor chunks
        (and shard indexes) in memory, so repeated reads from object storage
        issue no GET (see docs/object-storage.md).
        """
        unknown = sorted(set(writer_options) - set(WRITER_OPTIONS))
        if unknown:
            raise ValidationError(f"unknown option(s) {unknown}; writer options are {list(WRITER_OPTIONS)}")
        loc = resolve(path, dict(storage_options or {}))
        if not loc.exists(DESCRIPTOR):
            raise DatasetNotFoundError(f"no episodelake dataset at {loc.url} (missing {DESCRIPTOR})")
        try:
            descriptor = json.loads(loc.read_text(DESCRIPTOR))
        except json.JSONDecodeError as exc:
            raise DatasetNotFoundError(f"{loc.child_url(DESCRIPTOR)} is not valid JSON: {exc}") from exc
        if descriptor.get("format") != "episodelake" or descriptor.get("format_version") != FORMAT_VERSION:
            raise DatasetNotFoundError(
                f"{loc.child_url(DESCRIPTOR)} is not an episodelake v{FORMAT_VERSION} descriptor"
            )
        if version is not None and (not isinstance(version, int) or version < 0):
            raise ValidationError(f"version must be a non-negative int, got {version!r}")
        try:
            table = EpisodeTable.open(loc, version)
        except DeltaError as exc:  # the log itself is damaged: name the entries that do not parse
            from .maintenance import log_problems

            bad = "; ".join(str(p) for p in log_problems(loc)) or "no unparseable entry found"
            raise CorruptionError(f"episode table log at {loc.delta_uri()} cannot be read ({bad}): {exc}") from exc
        pinned = version is not None
        ds = cls(loc, descriptor, table, read_only=read_only or pinned, writer_options=writer_options, pinned=pinned)
        ds.verify = verify
        if cache_bytes:
            ds._ts_context = make_context(cache_bytes=cache_bytes)
        return ds

    @classmethod
    def from_episodes(
        cls,
        episodes: Iterable[Mapping[str, Any]],
        path: str | None = None,
        schema: DatasetSchema | None = None,
        **create_options: Any,
    ) -> Dataset:
        """Create a dataset from dict-form episodes and commit them.

        Each episode: ``initial_observation`` (reset observation) and
        ``observations`` ``[T, ...]`` (or ``observations`` ``[T + 1, ...]``
        alone), ``actions`` ``[T, ...]``, ``rewards`` ``[T]``, optional
        ``extras``, ``terminated``/``truncated`` (bool, or bool[T] set only on
        the last step) and ``meta`` (dict). Roles may be nested dicts. The
        schema is inferred from the first episode unless given.
        """
        it = iter(episodes)
        first = next(it, None)
        if schema is None:
            if first is None:
                raise ValidationError("cannot infer a schema from zero episodes; pass schema=")
            schema = infer_schema(first)
        ds = cls.create(schema, path, **create_options)
        if first is not None:
            # one call: a rejected episode withdraws the pending ones and is named by its index
            ds.append_episodes(itertools.chain([first], it))
        ds.flush()
        return ds

    # ---- writing
    def _writer_names(self) -> set[str]:
        return set(self.snapshot().index["writer"].tolist()) if len(self) else set()

    def _writer(self) -> CommitSink:
        if self.read_only:
            raise ReadOnlyError(f"dataset {self.location.url} is open read-only (or at a past version)")
        if self._sink is None or self._sink.pid != os.getpid():
            # A forked child writes under its own writer id; the parent's pending episodes stay the parent's.
            self._sink = CommitSink(self, **self._writer_options)
        return self._sink

    def new_episode(self, initial_obs: Any, **meta: Any) -> EpisodeWriter:
        """Start recording an episode at its reset observation; ``meta`` are meta fields."""
        return EpisodeWriter(self._writer(), initial_obs, meta)

    def vector_writer(
        self,
        initial_obs: Any,
        num_envs: int,
        autoreset_mode: str = "next_step",
        meta: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
    ) -> VectorEpisodeWriter:
        """A writer for ``num_envs`` parallel envs (see :class:`VectorEpisodeWriter`)."""
        return VectorEpisodeWriter(self._writer(), initial_obs, num_envs, autoreset_mode, meta)

    def append_episodes(self, episodes: Iterable[Mapping[str, Any]]) -> int:
        """Validate and append dict-form episodes (see :meth:`from_episodes`)."""
        return write_episodes(self._writer(), episodes)

    def validate_episode(self, episode: Mapping[str, Any]) -> None:
        """Raise ValidationError if ``episode`` would be rejected; writes nothing."""
        episode_from_dict(self.schema, episode, "episode")

    def flush(self) -> int | None:
        """Commit pending finished episodes now; returns the new version (None if none).

        Raises :class:`ValidationError` naming the fields, and commits nothing,
        while an ended episode still waits for ``required`` meta.
        """
        return self._sink.flush() if self._sink is not None else None

    def discard_pending(self) -> int:
        """Drop finished but uncommitted episodes, held ones included (never committed); returns how many."""
        return self._sink.discard() if self._sink is not None else 0

    def close(self) -> None:
        """:meth:`flush` (the dataset stays usable; reads need no close)."""
        self.flush()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_commit(self) -> None:
        self._snap = None

    # ---- versions
    @property
    def schema(self) -> DatasetSchema:
        return self._schema

    @property
    def version(self) -> int:
        return self._table.version

    def snapshot(self) -> Snapshot:
        """The snapshot every read uses: commits this object's handed-over episodes first (read-your-writes)."""
        sink = self._sink
        if sink is not None and sink.pending and sink.pid == os.getpid():
            sink.commit()
        if self._snap is None or self._snap.version != self._table.version:
            self._snap = Snapshot(self.location, self._schema, self._table, self._ts_context)
            self._snap.verify = self.verify
        return self._snap

    def refresh(self) -> Dataset:
        """Move to the latest committed version (no-op at a pinned past version)."""
        if self._pinned:
            return self
        self._table.refresh()
        return self

    def history(self) -> list[dict[str, Any]]:
        """The table's commits, newest first (this object's finished episodes are committed first)."""
        self.snapshot()
        return self._table.history()

    def compact(self) -> None:
        """Merge small table files and checkpoint the log."""
        if self.read_only:
            raise ReadOnlyError(f"dataset {self.location.url} is open read-only")
        self._table.compact()

    def validate(self, tensors: bool = True) -> ValidationReport:
        """Audit this version: table files, log, every episode's lengths, flags, stats and tensor checksums.

        Returns a report (``report.ok``, ``report.problems``); ``report.raise_if_failed()``
        turns problems into a :class:`CorruptionError`. Writes nothing.
        """
        from .maintenance import validate

        self.snapshot()  # read-your-writes: audit the version holding this object's finished episodes
        return validate(self, tensors=tensors)

    def vacuum(self, dry_run: bool = False, retention_hours: float | None = None) -> VacuumReport:
        """Delete unreferenced table files and crash leftovers in the tensors (see :mod:`maintenance`).

        Only data older than ``retention_hours`` (default 168) goes, so
        concurrent writers and retained versions stay intact.
        """
        from .maintenance import DEFAULT_RETENTION_HOURS, vacuum

        hours = DEFAULT_RETENTION_HOURS if retention_hours is None else retention_hours
        return vacuum(self, dry_run=dry_run, retention_hours=hours)

    @cached_property
    def info(self) -> dict[str, Any]:
        return dict(self.descriptor.get("info", {}))

    def __repr__(self) -> str:
        return f"Dataset({self.location.url!r}, version={self.version}, episodes={len(self)})"
