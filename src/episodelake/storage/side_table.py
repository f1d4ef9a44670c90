"""The derived columns' side table, as readers see it: the recorded state of a version and its values.

The write side (declarations, merges, the property commit) is
``write.derived``; snapshots and ``changes`` read through this module only, so
reads never import the write path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import DeltaTable

from ..core.schema import FieldSpec
from . import layout
from .location import Location

CONFIG_KEY = "episodelake.derived"  # the episode table property recording declarations and the side version
ID = "episode_id"


@dataclass(frozen=True)
class DerivedState:
    """The derived columns of one episode-table version: declarations and the side table version (None: no values)."""

    version: int | None = None
    fields: tuple[FieldSpec, ...] = ()

    @classmethod
    def of(cls, dt: DeltaTable) -> DerivedState:
        """The state recorded in the loaded version of the episode table ``dt``."""
        raw = dt.metadata().configuration.get(CONFIG_KEY)
        if raw is None:
            return cls()
        obj = json.loads(raw)
        return cls(obj["version"], tuple(FieldSpec.from_json(f) for f in obj["fields"]))

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "fields": [f.to_json() for f in self.fields]})

    def merged(self, other: DerivedState) -> DerivedState:
        """Both states' declarations (this one's first) and the newer side version."""
        known = {f.key for f in self.fields}
        fields = (*self.fields, *(f for f in other.fields if f.key not in known))
        versions = [v for v in (self.version, other.version) if v is not None]
        return DerivedState(max(versions) if versions else None, fields)


def side_uri(loc: Location) -> str:
    return loc.child_url(*layout.derived_parts())


def side_values(loc: Location, state: DerivedState) -> pa.Table:
    """``episode_id`` and every declared column (storage types, NULL where never set) at the pinned side version.

    One row per episode the side table holds (deleted episodes included: the
    caller keeps the ids it knows).
    """
    columns = {ID: pa.int64(), **{f.key: f.arrow_type() for f in state.fields}}
    if state.version is None:
        return pa.schema(list(columns.items())).empty_table()
    dt = DeltaTable(side_uri(loc), version=state.version, storage_options=loc.delta_options())
    data: pads.Dataset = dt.to_pyarrow_dataset(filesystem=loc.arrow_filesystem(*layout.derived_parts()))
    present = [name for name in columns if name in data.schema.names]
    tbl = data.to_table(columns=present)
    for name, typ in columns.items():
        if name not in present:
            tbl = tbl.append_column(pa.field(name, typ), pa.nulls(tbl.num_rows, typ))
    return tbl.select(list(columns)).cast(pa.schema(list(columns.items())))
