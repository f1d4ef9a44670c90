"""Schema edits of a dataset: drop fields, rename a field; each ONE Delta commit that rewrites only table rows.

Where the schema lives: the descriptor holds the schema at creation; a
schema edit records the new one in the Delta schema of the version it
commits (the field metadata of ``episode_id``, :data:`~episodelake.table.SCHEMA_KEY`),
which every later version carries (checkpoints included). A store takes the
schema of its pinned version, so time travel to a version before the edit
reads the dropped or renamed field as it was.

How: one overwrite of the whole episode table (predicate ``true``, the
table's schema replaced: :meth:`~episodelake.table.EpisodeTable.rewrite`)
with every row of the latest version, its columns of the dropped fields left
out (``ref/``, ``crc/`` and ``stats/`` columns of a tensor field with it) or
renamed. Tensor arrays are never written: a renamed tensor field keeps its
arrays under the old key (``FieldSpec.stored_as``); a dropped field's arrays
stay, as older versions still reference them (``vacuum`` reclaims none of
them: see docs/writing.md). An append that lands while the edit is planned
makes the overwrite conflict, and it is planned again on the version that
won; another schema edit landing first raises :class:`CommitConflictError`.

Rules: base fields only (a derived column, or a partition column, raises
:class:`ArgumentError`); the edited schema must be valid (at least one
observation, action and reward field; unique keys; meta names not reserved:
:class:`SchemaError`); a rename keeps the field's role. A writer that
recorded episodes under the old fields fails their commit with
:class:`SchemaError` (in this process and others); episodes started after the
edit use the new fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..core.errors import ArgumentError, CommitConflictError, SchemaError
from ..core.schema import DatasetSchema, FieldSpec
from ..read.snapshot import Snapshot
from ..storage.store import Store
from ..storage.table import SCHEMA_KEY, arrow_schema

DROP, RENAME = "DROP FIELDS", "RENAME FIELD"


@dataclass(frozen=True)
class SchemaEditReport:
    """What a schema edit changed (or, with ``dry_run``, would change).

    ``fields``: old key -> new key (None: dropped); ``columns``: episode
    table column -> its new name (None: dropped); ``episodes``: rows
    rewritten; ``version``: the version committed (the current one for a dry run).
    """

    operation: str
    version: int
    dry_run: bool
    fields: dict[str, str | None] = field(default_factory=dict)
    columns: dict[str, str | None] = field(default_factory=dict)
    episodes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: what changed (or would), and the version."""
        verb = "would change" if self.dry_run else "changed"
        edits = ", ".join(f"{a} -> {b}" if b is not None else f"{a} dropped" for a, b in self.fields.items())
        return f"{self.operation}: {verb} {edits} ({len(self.columns)} table columns); version {self.version}"


def drop_fields(store: Store, snap: Snapshot, keys: Sequence[str], dry_run: bool) -> SchemaEditReport:
    """Drop the base fields ``keys`` (their table columns) in one commit."""
    if not keys:
        raise ArgumentError("drop needs at least one field key")
    if len(set(keys)) != len(keys):
        raise ArgumentError(f"drop: field keys repeat: {list(keys)}")
    for key in keys:
        _base_field(store, snap, "drop", key)
    kept = [f for f in store.schema.fields if f.key not in keys]
    try:
        schema = DatasetSchema(kept)
    except SchemaError as exc:
        raise SchemaError(f"drop of {list(keys)}: the schema left is not valid: {exc}") from None
    old, new = arrow_schema(store.schema).names, set(arrow_schema(schema).names)
    columns: dict[str, str | None] = {name: None for name in old if name not in new}
    fields: dict[str, str | None] = dict.fromkeys(keys)
    return _commit(store, snap, schema, fields, columns, DROP, dry_run)


def rename_field(store: Store, snap: Snapshot, old: str, new: str, dry_run: bool) -> SchemaEditReport:
    """Rename base field ``old`` to key ``new`` (same role) in one commit."""
    f = _base_field(store, snap, "rename", old)
    if not isinstance(new, str) or not new:
        raise ArgumentError(f"rename: the new key must be a non-empty str, got {new!r}")
    if new == old:
        raise ArgumentError(f"rename: {old!r} already has that key")
    renamed = dataclasses.replace(f, name=_name_in_role(f, new), stored_as=None)
    if f.in_tensor and f.array_key != renamed.key:
        renamed = dataclasses.replace(renamed, stored_as=f.array_key)  # its arrays stay where they are
    try:
        schema = DatasetSchema(renamed if g.key == old else g for g in store.schema.fields)
        schema.with_derived(snap.derived.fields)
    except SchemaError as exc:
        raise SchemaError(f"rename of {old!r} to {new!r}: {exc}") from None
    pairs = zip(arrow_schema(store.schema).names, arrow_schema(schema).names, strict=True)
    columns: dict[str, str | None] = {a: b for a, b in pairs if a != b}
    return _commit(store, snap, schema, {old: new}, columns, RENAME, dry_run)


def _base_field(store: Store, snap: Snapshot, verb: str, key: Any) -> FieldSpec:
    """The base field ``key`` of ``store``'s schema; derived, partition and unknown keys raise ArgumentError."""
    if not isinstance(key, str):
        raise ArgumentError(f"{verb}: field keys are str, got {key!r}")
    if key in {f.key for f in snap.derived.fields}:
        raise ArgumentError(f"{verb}: {key!r} is a derived column; derived columns cannot be dropped or renamed")
    keys = [f.key for f in store.schema.fields]
    if key not in keys:
        raise ArgumentError(f"{verb}: {key!r} is not a field of this dataset (fields: {keys})")
    if key in store.descriptor.get("partition_by", []):
        raise ArgumentError(
            f"{verb}: {key!r} is a partition column of the episode table; its files are laid out by it "
            "(copy_to a dataset partitioned otherwise first)"
        )
    return store.schema[key]


def _name_in_role(f: FieldSpec, new: str) -> str:
    """The field name that gives ``f``'s role the key ``new`` (meta: the key itself)."""
    if f.role == "meta" or new == f.role:
        return new
    prefix = f"{f.role}/"
    if not new.startswith(prefix) or new == prefix:
        raise ArgumentError(
            f"rename: {f.key!r} is a {f.role} field and keeps its role: the new key is {f.role!r} "
            f"or {prefix}<name>, not {new!r}"
        )
    return new[len(prefix) :]


def _commit(
    store: Store,
    snap: Snapshot,
    schema: DatasetSchema,
    fields: dict[str, str | None],
    columns: dict[str, str | None],
    operation: str,
    dry_run: bool,
) -> SchemaEditReport:
    """Rewrite every row of the latest version under ``schema`` in one commit (unless ``dry_run``)."""
    if dry_run:
        return SchemaEditReport(operation, store.version, True, fields, columns, snap.num_episodes)
    planned = store.schema
    target = arrow_schema(schema)
    dropped = [name for name, renamed in columns.items() if renamed is None]
    rewritten = [0]

    def plan() -> pa.Table:
        store.load_schema()
        if store.schema is not planned:
            raise CommitConflictError(f"{operation}: the fields were edited concurrently: nothing was changed")
        names = pa.schema(store.table.dt.schema().to_arrow()).names  # other columns (quality) stay as they are
        rows = store.table.read(names).select(names).drop_columns(dropped)
        rows = rows.rename_columns([columns.get(name) or name for name in rows.column_names])
        fields = [target.field(n) if n in target.names else rows.schema.field(n) for n in rows.column_names]
        at = rows.column_names.index("episode_id")
        fields[at] = fields[at].with_metadata({SCHEMA_KEY: schema.dumps().encode()})
        rewritten[0] = rows.num_rows
        return rows.cast(pa.schema(fields))

    version = store.table.rewrite(plan, operation)
    store.load_schema()
    store.committed()
    return SchemaEditReport(operation, version, False, fields, columns, rewritten[0])
