"""One dataset root as storage: descriptor, schema, episode table and tensor context.

A :class:`Store` is what the write path (:mod:`commit`), :mod:`snapshot`,
:mod:`copy` and :mod:`maintenance` work on; :class:`~episodelake.dataset.Dataset`
is the public face over one. :meth:`Store.create` and :meth:`Store.open` own
the descriptor (``layout.DESCRIPTOR``): written last at creation, so its
presence marks a complete dataset, and checked at open.

The table handle is pinned to one version; :meth:`Store.refresh` moves it to
the latest unless the store was opened at a past version (``pinned``, always
read-only). The schema is the pinned version's: the one a schema edit
(``ds.columns.drop``/``rename``) recorded in that version's Delta schema
(:data:`~episodelake.table.SCHEMA_KEY`, the metadata of the ``episode_id`` column), else the
descriptor's (the schema at creation). Whoever appends to the table calls :meth:`Store.committed`, which
tells the subscribers (:meth:`Store.on_commit`) that the version moved.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as pkg_version
from typing import Any

import pyarrow as pa
import tensorstore as ts
from deltalake.exceptions import DeltaError

from ..core.errors import (
    ArgumentError,
    CorruptionError,
    DatasetExistsError,
    DatasetNotFoundError,
    EpisodeLakeError,
    ReadOnlyError,
    SchemaError,
)
from ..core.quality import Check, stored_checks
from ..core.schema import DatasetSchema, FieldSpec
from . import layout
from .diskcache import CacheConfig
from .faults import storage_fault
from .frames import FrameArray
from .location import Location
from .retention import FILE_SHARES, Capacity, Evictor
from .table import EpisodeTable, arrow_schema, log_problems
from .tensors import TensorArray, make_context

FORMAT_VERSION = 1
DEFAULT_DISK_CACHE_BYTES = 10 << 30  # bound of a disk cache opened without cache_bytes


def read_cache(
    location: Location, descriptor: Mapping[str, Any], cache_bytes: int, cache_dir: str | None
) -> CacheConfig | None:
    """Where reads of an object-store dataset's tensors are cached; None for local datasets and no cache.

    ``cache_dir``: a disk cache shared by every process of the node, bounded by
    ``cache_bytes`` (0: :data:`DEFAULT_DISK_CACHE_BYTES`); without it,
    ``cache_bytes`` > 0 is a per-process memory cache. Entries are keyed by the
    dataset's URL and creation stamp, so a dataset recreated at the same URL
    never reads the old one's entries.
    """
    if location.is_local or (cache_dir is None and not cache_bytes):
        return None
    stamp = str(descriptor.get("created_at", ""))
    if cache_dir is None:
        return CacheConfig(None, cache_bytes, stamp)
    return CacheConfig(os.path.abspath(os.fspath(cache_dir)), cache_bytes or DEFAULT_DISK_CACHE_BYTES, stamp)


@contextlib.contextmanager
def storage_faults(location: Location, where: str, doing: str) -> Iterator[None]:
    """Raise a storage fault inside the block (botocore, fsspec, OS errors) as a :class:`StorageError` naming
    ``where``; other errors pass unchanged."""
    try:
        yield
    except EpisodeLakeError:
        raise
    except Exception as exc:
        err = storage_fault(exc, dataset=location.url, object=where, doing=doing, endpoint=location.endpoint)
        if err is None:
            raise
        raise err from exc


def _remove_written(location: Location) -> None:
    """Remove what a failed create wrote into its (new or emptied) folder, so a retry finds it empty.

    Best effort: the create's own error is the one raised, whatever this meets.
    """
    with contextlib.suppress(Exception):
        for child in location.fs.ls(location.path, detail=False):
            with contextlib.suppress(FileNotFoundError):
                location.fs.rm(child, recursive=True)


def check_target(location: Location, overwrite: bool) -> bool:
    """Whether a dataset at ``location`` is to be replaced by a new one; :class:`DatasetExistsError` (before
    anything is written) when the new dataset must not be created there.

    Created only in a folder that does not exist, an empty one, or (with
    ``overwrite``) one holding a dataset (its ``episodelake.json``) or the
    leftover of a creation that was killed (a create, copy or merge: only a
    dataset's own folders, no ``episodelake.json``). A file, or a folder
    holding anything else, is refused whatever ``overwrite`` says: a new
    dataset never writes beside, nor deletes, files it did not make.
    """
    with storage_faults(location, location.child_url(layout.DESCRIPTOR), "creating the dataset"):
        if location.exists(layout.DESCRIPTOR):
            if not overwrite:
                raise DatasetExistsError(
                    f"a dataset already exists at {location.url}; pass overwrite=True to replace it"
                )
            return True
        fs = location.fs
        if fs.isfile(location.path):
            raise DatasetExistsError(
                f"{location.url} is a file, not a folder: a dataset is a folder; give the path of a new or empty "
                "folder (nothing was written)"
            )
        entries = fs.ls(location.path, detail=False) if fs.isdir(location.path) else []
    if entries:
        names = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries}
        if names <= {layout.TABLE, layout.TENSORS, layout.DERIVED, *layout.CACHE}:
            if overwrite:
                return True  # the leftover of a killed create/copy/merge: started over
            raise DatasetExistsError(
                f"{location.url} holds an incomplete dataset ({', '.join(sorted(names))} but no "
                f"{layout.DESCRIPTOR}: a create, copy or merge there was interrupted); pass overwrite=True to "
                "start over (it deletes that leftover), or remove the folder"
            )
        raise DatasetExistsError(
            f"{location.url} is not empty and holds no episodelake dataset (no {layout.DESCRIPTOR}): a dataset is "
            "created only in a new or empty folder, and overwrite=True replaces only a dataset; nothing was "
            "written (give another path)"
        )
    return False


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("episodelake", "numpy", "pyarrow", "deltalake", "tensorstore", "duckdb", "gymnasium"):
        try:
            out[pkg] = pkg_version(pkg)
        except PackageNotFoundError:
            continue
    return out


class Store:
    """A dataset root: ``location``, ``descriptor``, ``schema``, the pinned ``table`` and the TensorStore ``context``.

    ``durable`` turns TensorStore's fsync on; ``cache_bytes`` > 0 gives the
    context a chunk cache of that size.
    """

    def __init__(
        self,
        location: Location,
        descriptor: Mapping[str, Any],
        table: EpisodeTable,
        *,
        read_only: bool = False,
        pinned: bool = False,
        durable: bool = False,
        cache_bytes: int = 0,
    ) -> None:
        self.location = location
        self.descriptor = dict(descriptor)
        self.table = table
        self._recorded: bytes | None = None
        self.schema = DatasetSchema.from_json(descriptor["schema"])
        self.load_schema()
        self.read_only = read_only or pinned
        self.pinned = pinned
        self._polled = -float("inf")  # time.monotonic() of the last look at the log
        self.context: ts.Context = make_context(durable=durable, cache_bytes=cache_bytes)
        self._subscribers: list[weakref.WeakMethod[Callable[[], None]]] = []
        capacity = descriptor.get("capacity")
        self.capacity = Capacity.from_json(capacity) if capacity else None
        self._evictor = Evictor(self.capacity) if self.capacity else None
        if self.capacity:
            self.table.file_shares = FILE_SHARES
        # One array per commit (dropped whole by vacuum once unreferenced): object stores and capacity datasets.
        self.per_commit: bool = descriptor["tensor_layout"].get("per_commit", not location.is_local)

    @classmethod
    def create(
        cls,
        location: Location,
        schema: DatasetSchema,
        *,
        partition_by: Iterable[str] = (),
        overwrite: bool = False,
        durable: bool = False,
        info: Mapping[str, Any] | None = None,
        capacity: Capacity | None = None,
    ) -> Store:
        """Create an empty dataset at ``location``: the table, then the descriptor.

        ``partition_by`` names scalar meta fields to hive-partition the table
        by (:class:`SchemaError` otherwise). An existing dataset raises
        :class:`DatasetExistsError` unless ``overwrite``, which deletes it first.
        ``capacity`` (stored in the descriptor) makes every commit evict the
        oldest episodes beyond it, and tensors use one array per commit.
        """
        if not isinstance(schema, DatasetSchema):
            raise SchemaError(f"schema must be a DatasetSchema, got {type(schema).__name__}")
        parts = list(partition_by)
        meta_names = {f.name for f in schema.meta_fields}
        for p in parts:
            if p not in meta_names:
                raise SchemaError(f"partition_by {p!r} is not a meta field ({sorted(meta_names)})")
            if schema[p].shape != ():
                raise SchemaError(f"partition_by {p!r} must be a scalar meta field")
        if check_target(location, overwrite):
            location.fs.rm(location.path, recursive=True)
        descriptor = {
            "format": "episodelake",
            "format_version": FORMAT_VERSION,
            "schema": schema.to_json(),
            "partition_by": parts,
            "tensor_layout": {
                "format": "zarr3",
                "sharded": not location.is_local,
                "per_commit": not location.is_local or capacity is not None,
                "root": layout.TENSOR_ROOT,
            },
            "created_at": datetime.now(UTC).isoformat(),
            "info": dict(info or {}),
            "versions": _versions(),
        }
        if capacity is not None:
            descriptor["capacity"] = capacity.to_json()
        try:
            table = EpisodeTable.create(location, arrow_schema(schema), parts)
            # The descriptor is written last: its presence marks a complete dataset.
            location.write_text_atomic(json.dumps(descriptor, indent=2), layout.DESCRIPTOR)
        except BaseException:
            _remove_written(location)  # the folder was new or empty (check_target): what is there, this wrote
            raise
        return cls(location, descriptor, table, durable=durable)

    @classmethod
    def open(
        cls,
        location: Location,
        version: int | None = None,
        *,
        read_only: bool = False,
        cache_bytes: int = 0,
        cache_dir: str | None = None,
    ) -> Store:
        """Open the dataset at ``location``, at table ``version`` (None: the latest; else pinned and read-only).

        Reads of an object store's tensors are cached (see :func:`read_cache`):
        on disk under ``cache_dir`` (bounded by ``cache_bytes``, default
        :data:`DEFAULT_DISK_CACHE_BYTES`), else in memory when ``cache_bytes`` > 0.

        Raises :class:`DatasetNotFoundError` without a valid descriptor,
        :class:`ArgumentError` for a bad or unknown version,
        :class:`StorageError` when the storage cannot be reached (within the
        location's :class:`~episodelake.location.StorageTimeouts`) and
        :class:`CorruptionError` naming the log entries that do not parse when
        the table log cannot be read.
        """
        where = location.child_url(layout.DESCRIPTOR)
        with storage_faults(location, where, "opening the dataset"):
            found = location.exists(layout.DESCRIPTOR)
            text = location.read_text(layout.DESCRIPTOR) if found else ""
        if not found:
            raise DatasetNotFoundError(f"no episodelake dataset at {location.url} (missing {layout.DESCRIPTOR})")
        try:
            descriptor = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetNotFoundError(f"{where} is not valid JSON: {exc}") from exc
        if descriptor.get("format") != "episodelake" or descriptor.get("format_version") != FORMAT_VERSION:
            raise DatasetNotFoundError(f"{where} is not an episodelake v{FORMAT_VERSION} descriptor")
        if version is not None and (not isinstance(version, int) or version < 0):
            raise ArgumentError(f"version must be a non-negative int, got {version!r}")
        try:
            table = EpisodeTable.open(location, version)
        except DeltaError as exc:  # the log itself is damaged: name the entries that do not parse
            err = storage_fault(
                exc,
                dataset=location.url,
                object=location.delta_uri(),
                doing="opening the table",
                endpoint=location.endpoint,
            )
            if err is not None:
                raise err from exc
            bad = "; ".join(f"{path}: {what}" for path, what in log_problems(location)) or "no unparseable entry found"
            raise CorruptionError(f"episode table log at {location.delta_uri()} cannot be read ({bad}): {exc}") from exc
        config = read_cache(location, descriptor, cache_bytes, cache_dir)
        if config is not None:  # a copy: the caller's location (and its reads) stay uncached
            location = replace(location, read_cache=config)
        # a disk cache's bound is no memory budget: TensorStore's in-memory pool only without one
        memory = cache_bytes if config is None or config.directory is None else 0
        return cls(location, descriptor, table, read_only=read_only, pinned=version is not None, cache_bytes=memory)

    @property
    def version(self) -> int:
        """The table version this store is pinned to."""
        return self.table.version

    def refresh(self, min_interval: float = 0.0) -> None:
        """Move to the latest committed version (nothing at a pinned past version), and to its schema.

        ``min_interval`` (seconds): look at the log only if the last look is
        at least that old (a stream following commits polls before every
        batch; this store's own commits move it without a look).
        """
        now = time.monotonic()
        if min_interval and now - self._polled < min_interval:
            return
        self._polled = now
        if not self.pinned:
            before = self.table.version
            self.table.refresh()
            if self.table.version != before:
                self.load_schema()

    def load_schema(self) -> None:
        """Take the schema of the pinned table version: a schema edit's, else the descriptor's.

        An unchanged schema keeps its object (writers compare by identity).
        """
        raw = self.table.schema_stamp()
        if raw != self._recorded:
            self._recorded = raw
            self.schema = DatasetSchema.from_json(json.loads(raw) if raw is not None else self.descriptor["schema"])

    def checks(self) -> tuple[Check, ...]:
        """The quality checks recorded in the table version this store is on (:meth:`refresh` first for the latest)."""
        return stored_checks(self.table.dt.metadata().configuration)

    def writer_names(self) -> set[str]:
        """Writers (8 hex digits) that have episodes in the pinned version."""
        return set(self.table.read(["writer"]).column("writer").to_pylist())

    def new_array(self, writer: str, field: FieldSpec) -> TensorArray | FrameArray:
        """The writing side of ``writer``'s rows of ``field`` (see :meth:`TensorArray.create`; ``codec=`` fields:
        :class:`FrameArray`)."""
        kind = FrameArray if field.framed else TensorArray
        return kind.create(self.location, writer, field, self.context, per_commit=self.per_commit)

    def open_array(
        self, writer: str, field: FieldSpec, commit: int = 0, read_only: bool = True
    ) -> TensorArray | FrameArray:
        """One existing array of ``writer``'s rows of ``field`` (``commit`` 0: its single array)."""
        if field.framed:
            return FrameArray(self.location, writer, field, self.context, commit)
        return TensorArray.open(self.location, writer, field, self.context, read_only=read_only, commit=commit)

    def append(self, rows: pa.Table, token: str | None = None) -> int:
        """Commit ``rows`` (call :meth:`committed` afterwards); with a capacity, evicting in the same commit.

        Rows of the schema before a schema edit that landed meanwhile (another
        process's) raise :class:`SchemaError` naming the version, and this
        store moves to the new schema. ``token``: the commit's token in the log
        (:meth:`EpisodeTable.find_commit`).
        """
        evictor = self._evictor
        try:
            if evictor is None:
                return self.table.append(rows, self._recorded, token=token)
            plan = evictor.plan
            return self.table.commit(
                lambda: plan(self.table, rows), landed=evictor.committed, stamp=self._recorded, token=token
            )
        except Exception:
            try:
                self.table.refresh()
                self.load_schema()
                read = True
            except Exception:
                read = False  # the log cannot be read either (an outage): the commit's own error tells
            if not read:
                raise
            if rows.schema.names != arrow_schema(self.schema).names:
                raise SchemaError(
                    f"dataset {self.location.url}: its schema was edited (version {self.version}) after these "
                    f"episodes were recorded; they were not committed: reopen the dataset to write"
                ) from None
            raise

    def delete(self, ids: Sequence[int]) -> int:
        """Remove the episodes ``ids`` from the latest version in one commit (notifies); return the new version."""
        self.check_writable()
        empty = arrow_schema(self.schema).empty_table()
        version = self.table.commit(lambda: (empty, ids))
        self.committed()
        return version

    def clear(self) -> int:
        """Remove every episode from the latest version in one commit (notifies); return the new version."""
        self.check_writable()
        version = self.table.clear(arrow_schema(self.schema))
        self.committed()
        return version

    def check_writable(self) -> None:
        """:class:`ReadOnlyError` when this store writes nothing (opened read-only or at a past version)."""
        if self.read_only:
            raise ReadOnlyError(f"dataset {self.location.url} is open read-only (or at a past version)")

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call the bound method ``callback`` after each commit through this store (held weakly)."""
        self._subscribers.append(weakref.WeakMethod(callback))

    def committed(self) -> None:
        """Record that the table changed (its handle already moved): notify the subscribers."""
        for ref in list(self._subscribers):
            callback = ref()
            if callback is None:
                self._subscribers.remove(ref)
            else:
                callback()
