"""Merge several datasets (or views) into ONE new dataset, verified as :func:`~episodelake.copy.copy_to` verifies.

:func:`merge` writes every chosen episode of every source into a new dataset
at ``target`` (memory, disk or object storage, from any of them), through
the copy machinery (:mod:`.copy`): tensor rows re-written in batches of
about ``batch_bytes``, one table commit per batch, then the copy reopened
and checked (episode ids and order, every table column, derived values,
every episode's tensor CRC-32s).

* **Schema**: the sources' fields must agree in key, role, dtype, shape,
  layout, storage kind, codec, flags and defaults (chunking, compression and
  descriptions may differ: the first source's are kept), derived columns
  included; otherwise :class:`SchemaError` names the source and the field.
* **Ids**: ids embed their writer, and two sources may share writer numbers
  (or edit ids): each ``(source, writer)`` gets a fresh writer number at the
  destination, and its episodes the ids ``number << 32 | rank`` (rank in
  the source's episode order). ``created_at``, lengths, flags, meta, per-step
  fields, statistics and checksums are copied as stored, so the destination
  orders episodes by ``(created_at, episode_id)`` as every dataset does.
* **Lineage**: two meta columns are added: ``source`` (str, the source
  dataset's URL) and ``source_episode_id`` (int64, the episode's id there).
  A source that already has a field of either name raises
  :class:`SchemaError` (rename it first: ``ds.columns.rename``).

* **Settings**: unless the caller gives them, the destination takes the
  sources' dataset-level settings: the stored quality checks of every
  source (the union; two checks of the same name that differ raise
  :class:`ArgumentError` naming both sources), the capacity when every
  source has the same one (or none; sources that differ raise
  :class:`ArgumentError`: pass ``capacity=``), and the first source's
  partitioning and ``info``. With a capacity, only the newest episodes of
  all sources together that fit it are merged (FIFO in the destination's
  episode order). ``capacity=None`` / ``checks=()`` merge into a dataset
  without them.

The destination's history starts fresh. Nothing is merged into an existing
dataset: ``target`` is created (``overwrite`` replaces one).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ArgumentError, LocationError, SchemaError
from ..core.progress import bar
from ..core.quality import Check, check_list
from ..core.schema import DatasetSchema, FieldSpec
from ..read.snapshot import Snapshot
from ..storage.frames import FrameArray
from ..storage.location import Location
from ..storage.retention import Capacity
from ..storage.store import Store
from ..storage.table import arrow_schema
from ..storage.tensors import TensorArray
from .copy import (
    KEEP,
    _batches,
    _copy_derived,
    _copy_tensor_rows,
    _source_rows,
    create_like,
    fifo_kept,
    record_stored_checks,
    verify_copy,
)

SOURCE, SOURCE_ID = "source", "source_episode_id"
LINEAGE = (
    FieldSpec(SOURCE, (), "str", role="meta", description="URL of the dataset the episode was merged from"),
    FieldSpec(SOURCE_ID, (), "int64", role="meta", description="the episode's id in that dataset"),
)
# Settings that change how a field is stored, never what reads return: sources may differ in them.
_STORAGE_ONLY = ("description", "chunk_rows", "compression", "stored_as")


def merge(
    sources: Sequence[tuple[Store, Snapshot, np.ndarray]],
    target: Location,
    *,
    capacity: Capacity | None = KEEP,
    checks: Iterable[Check] = KEEP,
    overwrite: bool = False,
    progress: bool | None = None,
    verify: bool = True,
    batch_bytes: int = 256 << 20,
) -> Store:
    """Merge the episodes at ``positions`` of each ``(store, snapshot, positions)`` into a new dataset at ``target``.

    ``capacity``/``checks`` omitted: the sources' (see the module docstring:
    :func:`merged_capacity`, :func:`merged_checks`); given, they replace them
    (given checks are bound over the views by the caller).
    Returns the merged dataset, opened afresh. Raises :class:`ArgumentError`
    without sources or when the sources' capacities or same-named checks
    differ and nothing replaces them, :class:`LocationError` when ``target``
    is a source, :class:`SchemaError` when the sources' fields differ and
    :class:`CorruptionError` if verification finds a difference.
    """
    if not sources:
        raise ArgumentError("merge needs at least one source dataset")
    for store, _, _ in sources:
        if store.location.url == target.url:
            raise LocationError(f"cannot merge {target.url} into itself")
    schema = merged_schema([(store.location.url, snap.schema) for store, snap, _ in sources])
    if capacity is KEEP:
        capacity = merged_capacity([(store.location.url, store.capacity) for store, _, _ in sources])
    stored = (
        merged_checks([(store.location.url, snap.checks) for store, snap, _ in sources])
        if checks is KEEP
        else check_list(checks)
    )
    out = create_like(sources[0][0], target, schema, overwrite, capacity=capacity)
    record_stored_checks(out, stored)
    taken: set[str] = set()
    planned = []
    for store, snap, positions in sources:
        positions = np.asarray(positions, dtype=np.int64)
        planned.append((snap, positions, _renumbered(store, snap, positions, out.schema, taken)))
    if capacity is not None:  # the newest episodes of all sources together that fit
        kept = fifo_kept(pa.concat_tables([rows for _, _, rows in planned]), capacity)
        bounds = np.cumsum([0] + [len(p) for _, p, _ in planned])
        planned = [
            (snap, positions[kept[a:b]], rows.filter(pa.array(kept[a:b])))
            for (snap, positions, rows), a, b in zip(planned, bounds[:-1], bounds[1:], strict=True)
        ]
    expected: list[pa.Table] = []
    values: list[pa.Table] = []
    total = sum(len(positions) for _, positions, _ in planned)
    with bar(total, f"merge into {target.url}", progress, unit="episode") as shown:
        for snap, positions, rows in planned:
            arrays: dict[tuple[str, str], TensorArray | FrameArray] = {}
            writers = rows["writer"].to_pylist()
            for lo, hi in _batches(snap, positions, batch_bytes, capacity):
                batch = rows.slice(lo, hi - lo)
                for f in out.schema.tensor_fields:
                    name = f"ref/{f.key}"
                    part = positions[lo:hi]
                    refs, _ = _copy_tensor_rows(snap, out, snap.schema[f.key], part, writers[lo:hi], arrays, f)
                    batch = batch.set_column(batch.schema.get_field_index(name), name, refs)
                out.table.append(batch)
                out.committed()
                shown.update(hi - lo)
            expected.append(rows)
            held = _copy_derived(snap, positions, out, rows["episode_id"])
            if held is not None:
                values.append(held)
    merged = Store.open(target)
    if verify:
        rows = pa.concat_tables(expected)
        order = pa.array(np.lexsort((rows["episode_id"].to_numpy(), rows["created_at"].to_numpy())))
        verify_copy(rows.take(order), Snapshot(merged), pa.concat_tables(values).take(order) if values else None)
    return merged


def merged_capacity(capacities: Sequence[tuple[str, Capacity | None]]) -> Capacity | None:
    """The capacity of sources ``(url, capacity)``: theirs when all have the same (or none), else
    :class:`ArgumentError` naming two that differ."""
    url0, first = capacities[0]
    for url, capacity in capacities[1:]:
        if capacity != first:
            raise ArgumentError(
                f"merge: the sources' capacities differ ({url0}: {first or 'none'}; {url}: {capacity or 'none'}); "
                "pass capacity= to choose the merged dataset's (None: no capacity)"
            )
    return first


def merged_checks(checks: Sequence[tuple[str, Sequence[Check]]]) -> tuple[Check, ...]:
    """The stored checks of sources ``(url, checks)``: each distinct check once, in the order first met;
    :class:`ArgumentError` naming both sources when two checks of the same name differ."""
    seen: dict[str, tuple[str, Check]] = {}
    for url, stored in checks:
        for c in stored:
            if c.name not in seen:
                seen[c.name] = (url, c)
            elif seen[c.name][1] != c:
                first_url, first = seen[c.name]
                raise ArgumentError(
                    f"merge: {first_url} and {url} both store a check named {c.name!r} and they differ "
                    f"({first} vs {c}); pass checks= to choose the merged dataset's (() for none)"
                )
    return tuple(c for _, c in seen.values())


def merged_schema(schemas: Sequence[tuple[str, DatasetSchema]]) -> DatasetSchema:
    """The destination schema of sources ``(url, schema)``: the first's base fields (arrays under their keys)
    plus :data:`LINEAGE`; :class:`SchemaError` naming the source and field where they differ."""
    for url, schema in schemas:
        clash = [f.key for f in schema.fields if f.key in (SOURCE, SOURCE_ID)]
        if clash:
            raise SchemaError(
                f"merge: {url} has fields {clash}, the names of the lineage columns merge adds; "
                "rename them first (ds.columns.rename)"
            )
    url0, schema0 = schemas[0]
    for url, schema in schemas[1:]:
        difference = _difference(schema0, schema)
        if difference:
            raise SchemaError(f"merge: the schema of {url} differs from that of {url0}: {difference}")
    fields = [dataclasses.replace(f, stored_as=None) for f in schema0.base.fields]
    return DatasetSchema([*fields, *LINEAGE])


def _difference(a: DatasetSchema, b: DatasetSchema) -> str | None:
    """The first difference between two schemas that changes what reads return, in words; None if none."""
    keys_a, keys_b = [f.key for f in a.fields], [f.key for f in b.fields]
    missing, extra = [k for k in keys_a if k not in keys_b], [k for k in keys_b if k not in keys_a]
    if missing or extra:
        return f"fields only in the first: {missing}, only in this one: {extra}"
    for key in keys_a:
        fa, fb = _semantic(a[key]), _semantic(b[key])
        for name in sorted(set(fa) | set(fb)):
            if fa.get(name) != fb.get(name):
                return f"field {key!r}: {name} {fa.get(name)!r} vs {fb.get(name)!r}"
    return None


def _semantic(f: FieldSpec) -> dict[str, Any]:
    spec = {k: v for k, v in f.to_json().items() if k not in _STORAGE_ONLY}
    spec["in_tensor"] = f.in_tensor
    return spec


def _renumbered(
    store: Store, snap: Snapshot, positions: np.ndarray, schema: DatasetSchema, taken: set[str]
) -> pa.Table:
    """The table rows of ``snap``'s episodes at ``positions`` under fresh writers and ids, with their lineage.

    ``taken``: writer names used at the destination so far (the new ones are added).
    """
    rows = _source_rows(snap, positions)
    old_writers = rows["writer"].to_numpy(zero_copy_only=False)
    ids = np.empty(len(positions), np.int64)
    writers = np.empty(len(positions), object)
    for w in dict.fromkeys(old_writers.tolist()):
        number = secrets.randbelow(1 << 31)
        while f"{number:08x}" in taken:
            number = secrets.randbelow(1 << 31)
        taken.add(f"{number:08x}")
        mine = old_writers == w
        writers[mine] = f"{number:08x}"
        ids[mine] = (number << 32) | np.arange(int(mine.sum()), dtype=np.int64)
    lineage = {
        "episode_id": pa.array(ids, pa.int64()),
        "writer": pa.array(writers.tolist(), pa.string()),
        SOURCE: pa.array([store.location.url] * len(positions), pa.string()),
        SOURCE_ID: rows["episode_id"],
    }
    target = arrow_schema(schema)
    return pa.table([lineage[name] if name in lineage else rows[name] for name in target.names], schema=target)
