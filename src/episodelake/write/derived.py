"""Derived columns: per-episode and per-step values added after the fact, versioned with the dataset.

Episodes are immutable once committed; values computed later (returns,
value targets, advantages, relabelled rewards, priorities, labels, language
instructions) live beside them, never in the base table rows or tensors:

* **Values**: one side Delta table (``layout.derived_parts()``), one row per
  episode ever updated, keyed by ``episode_id``: a per-episode column holds
  the value, a per-step column the episode's list of rows (as the episode
  table stores small per-step fields). An update is one Delta ``merge``
  (upsert) of the updated episodes' rows; columns appear with their first
  update (schema merge).
* **Declarations and versions**: the episode table's property
  :data:`CONFIG_KEY` holds ``{"version": <side table version>, "fields":
  [<FieldSpec JSON>...]}``. Each update (and each declaration) sets it in one
  metadata commit of the episode table, after the merge landed. Table
  properties are part of every version's Delta metadata (checkpoints
  included), so a snapshot at episode-table version ``v`` reads the side table
  at the version recorded in ``v``: time travel sees the values of that
  version, and a reader sees an update only once its commit is in the
  episode table.
* **Concurrency**: a merge that loses a race to another is retried on the
  side table's latest version; the property commit is a read-modify-write
  (recorded version = max of the two, declarations = union), retried until a
  re-read shows it. Both updates land, or after :data:`RETRIES` attempts
  :class:`~episodelake.errors.CommitConflictError` says which column did not.
* Rows of deleted or evicted episodes stay in the side table but are never
  read: readers keep only the ids of their snapshot.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from ..core.checks import check_values, meta_value
from ..core.episode import rows_for
from ..core.errors import ArgumentError, CommitConflictError, EpisodeLakeError, SchemaError, ValidationError
from ..core.schema import DatasetSchema, FieldSpec
from ..storage import layout
from ..storage.location import Location
from ..storage.rows import meta_column, step_column
from ..storage.side_table import CONFIG_KEY, ID, DerivedState, side_uri
from ..storage.store import Store
from ..storage.table import OPERATION_KEY, table_error, vacuum_table_files

RETRIES = 20


def declared(spec: FieldSpec) -> FieldSpec:
    """``spec`` as a derived column (``derived=True``), checked for what derived columns allow."""
    if not isinstance(spec, FieldSpec):
        raise SchemaError(f"a derived column is declared with a FieldSpec, got {type(spec).__name__}")
    return spec if spec.derived else dataclasses.replace(spec, derived=True)


def declare(store: Store, known: DatasetSchema, specs: Iterable[FieldSpec]) -> int:
    """Add derived column declarations (one episode-table commit); return the new version.

    ``known`` is the schema with the columns already declared. A key taken by
    a field, or by a derived column declared differently, is a
    :class:`SchemaError`; declaring the same column again changes nothing.
    """
    new: list[FieldSpec] = []
    for spec in map(declared, specs):
        try:
            have = known[spec.key]
        except KeyError:
            have = None
        if have is not None and (not have.derived or have.to_json() != spec.to_json()):
            raise SchemaError(f"derived column {spec.key!r}: the key is already a field {have}")
        if have is None and spec.key not in {f.key for f in new}:
            new.append(spec)
    DatasetSchema([*known.fields, *new])  # every schema rule (reserved names, duplicate keys) holds
    return _record(store, DerivedState(None, tuple(new)), "ADD COLUMN")


def encode(f: FieldSpec, values: Any, lengths: np.ndarray, ids: np.ndarray) -> pa.Array:
    """``values`` of derived column ``f`` for episodes ``ids`` (of ``lengths``) as its table column, validated.

    A per-episode column takes one value per episode (None: unset). A
    per-step column takes one array per episode (``rows_for(f, length)`` rows)
    or one array of all their rows, episode after episode. Anything else is a
    :class:`ValidationError` naming the column and the episode.
    """
    n = len(ids)
    if f.role == "meta":
        items = _per_episode(f, values, n)
        checked = [meta_value(f, v, f"update of episode {int(i)}") for v, i in zip(items, ids, strict=True)]
        valid = np.array([v is not None for v in checked], dtype=bool)
        if f.np_dtype.kind == "U":
            stacked = np.array([v or "" for v in checked], dtype=object)
        else:
            stacked = np.zeros((n, *f.shape), f.np_dtype)
            if valid.any():
                stacked[valid] = np.stack([v for v in checked if v is not None])
        return meta_column(f, stacked, valid, f.arrow_type())
    rows = np.array([rows_for(f, int(t)) for t in lengths], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    total = int(starts[-1])
    if isinstance(values, np.ndarray) and values.ndim == len(f.shape) + 1 and len(values) == total:
        block = check_values(f, values, (total,), f"update of {n} episodes (all rows in one array)")
    else:
        items = _per_episode(f, values, n)
        where = [f"update of episode {int(i)}" for i in ids]
        pieces = [check_values(f, v, (int(r),), w) for v, r, w in zip(items, rows, where, strict=True)]
        block = np.concatenate(pieces) if pieces else np.zeros((0, *f.shape), f.np_dtype)
    return step_column(f, block, starts, f.arrow_type())


def _per_episode(f: FieldSpec, values: Any, n: int) -> list[Any]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise ValidationError(f"update: column {f.key!r} needs a sequence of {n} values, got {type(values).__name__}")
    if len(values) != n:
        raise ValidationError(f"update: column {f.key!r} has {len(values)} values for {n} episodes")
    return list(values)


def write(store: Store, ids: np.ndarray, columns: Mapping[str, pa.Array]) -> int:
    """Upsert ``columns`` (already encoded, one row per id) for episodes ``ids``; return the new table version.

    The side table merge lands first, then the episode-table commit that
    makes it visible (see the module docstring).
    """
    if len(set(ids.tolist())) != len(ids):
        raise ArgumentError("update: episode ids repeat")
    source = pa.table({ID: pa.array(ids, pa.int64()), **columns})
    side = _merge(store.location, source)
    return _record(store, DerivedState(side, ()), "UPDATE")


def _merge(loc: Location, source: pa.Table) -> int:
    """Upsert ``source`` into the side table (created on first use); return the side version it made."""
    uri, options = side_uri(loc), loc.delta_options()
    names = [f'"{c}"' for c in source.column_names if c != ID]
    sets = {name: f"s.{name}" for name in names}

    def attempt() -> int:
        try:
            dt = DeltaTable(uri, storage_options=options)
        except TableNotFoundError:
            dt = _create_side(uri, options)
        props = CommitProperties(custom_metadata={OPERATION_KEY: "UPDATE"})
        merger = dt.merge(
            source, f"t.{ID} = s.{ID}", source_alias="s", target_alias="t", merge_schema=True, commit_properties=props
        )
        merger.when_matched_update(updates=sets).when_not_matched_insert(updates={ID: f"s.{ID}", **sets}).execute()
        return dt.version()

    return _retry(attempt, f"update of {names} at {loc.url}", loc)


def _create_side(uri: str, options: dict[str, str] | None) -> DeltaTable:
    schema = pa.schema([pa.field(ID, pa.int64(), nullable=False)])
    try:
        return DeltaTable.create(uri, schema=schema, mode="ignore", storage_options=options)
    except DeltaError:  # another process created it first
        return DeltaTable(uri, storage_options=options)


def _record(store: Store, change: DerivedState, operation: str = "UPDATE") -> int:
    """Merge ``change`` into the episode table's recorded state; retried until a re-read shows it. New version.

    ``operation`` names the commit in history (``ADD COLUMN``, ``UPDATE``).
    """
    props = CommitProperties(custom_metadata={OPERATION_KEY: operation})

    def attempt() -> int:
        dt = store.table.dt
        dt.update_incremental()
        current = DerivedState.of(dt)
        if current.merged(change) != current:
            dt.alter.set_table_properties(
                {CONFIG_KEY: current.merged(change).to_json()}, raise_if_not_exists=False, commit_properties=props
            )
            dt.update_incremental()
            now = DerivedState.of(dt)
            if now.merged(change) != now:
                raise CommitFailedError("the derived state was overwritten concurrently")
        return dt.version()

    version = _retry(attempt, f"recording derived columns at {store.location.url}", store.location)
    store.committed()
    return version


def vacuum_side(loc: Location, retention_hours: float, dry_run: bool) -> list[str]:
    """Delete side-table files no kept side version references, as the episode table's vacuum does; their URIs.

    Files removed from the side table longer than ``retention_hours`` ago go,
    and files it never referenced once past the unreferenced-file floor
    (:func:`~episodelake.table.vacuum_table_files`). Rows of deleted episodes
    stay in live files (never read); versions of the episode table older than
    the retention may then fail to read their values.
    """
    paths = vacuum_table_files(loc, layout.derived_parts(), retention_hours, dry_run)
    return sorted(
        loc.child_url(*layout.derived_parts(), path[len(loc.child(*layout.derived_parts())) + 1 :]) for path in paths
    )


def _retry(attempt: Callable[[], int], what: str, loc: Location | None = None) -> int:
    """``attempt`` until it lands: conflicts retried with backoff (then CommitConflictError).

    With ``loc`` (the dataset), other failures are raised typed (StorageError, CorruptionError).
    """
    delay = 0.01
    for n in range(RETRIES):
        try:
            return attempt()
        except CommitFailedError as exc:
            if n == RETRIES - 1:
                raise CommitConflictError(f"{what} conflicted {RETRIES} times with concurrent updates: {exc}") from exc
            time.sleep(delay)  # back off before retrying a lost optimistic-concurrency race
            delay = min(delay * 2, 1.0)
        except EpisodeLakeError:
            raise
        except Exception as exc:
            if loc is None:
                raise
            raise table_error(exc, loc, what) from exc
    raise AssertionError("unreachable")
