"""What changed between two versions of a dataset: episodes added, removed (deleted or evicted) and updated.

Every version of the episode table is a set of immutable data files, and
every episode lives in exactly one file of a version. Between versions ``a``
and ``b``, the files of ``a`` not in ``b`` hold every episode removed since
(and the unchanged neighbours of rewritten files, of compactions), the files
of ``b`` not in ``a`` every episode added since (and those same neighbours):
so ``added`` = ids of the new files minus ids of the gone files, ``removed``
= the converse, and a compaction, which moves episodes between files, shows
no change. Only the files that differ are read, not the whole table.

``updated``: episodes live in both versions whose table row was replaced by
an edit (``ds.edit``: trim, set meta; a row in both the gone and the new
files whose length, flags, return, meta, references or checksums differ) or
whose derived columns (``ds.columns.update``, :mod:`.derived`) hold different
values at the side-table versions the two table versions record (a value
set back to what it was is no change; a new declaration without values is
none either).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core.errors import ArgumentError
from ..storage.side_table import DerivedState, side_values
from ..storage.store import Store
from ..storage.table import EpisodeTable, read_table_file


@dataclass(frozen=True)
class Changes:
    """Episode ids (sorted int64 arrays) that changed from version ``since`` to version ``version``."""

    since: int
    version: int
    added: np.ndarray
    removed: np.ndarray  # deleted or evicted
    updated: np.ndarray  # derived column values changed

    def __bool__(self) -> bool:
        return bool(len(self.added) or len(self.removed) or len(self.updated))

    def __repr__(self) -> str:
        return (
            f"Changes(since={self.since}, version={self.version}, added={len(self.added)}, "
            f"removed={len(self.removed)}, updated={len(self.updated)})"
        )


def changes(store: Store, since: int) -> Changes:
    """The episodes added, removed and updated from table version ``since`` to ``store``'s pinned version."""
    if isinstance(since, bool) or not isinstance(since, int | np.integer) or since < 0:
        raise ArgumentError(f"changes: since_version must be an int >= 0, got {since!r}")
    now = store.table
    if since > now.version:
        raise ArgumentError(f"changes: since_version {since} is after this dataset's version {now.version}")
    then = EpisodeTable.open(store.location, int(since))
    before, after = then.file_set(), now.file_set()
    # quarantined episodes count as absent, as in snapshots: a release adds one, a quarantined append adds none
    gone, new = then.episode_ids_in(before - after, visible=True), now.episode_ids_in(after - before, visible=True)
    added = np.setdiff1d(new, gone)
    removed = np.setdiff1d(gone, new)
    old_state, new_state = DerivedState.of(then.dt), DerivedState.of(now.dt)
    updated = _edited(store, then, before - after, after - before, np.intersect1d(gone, new))
    if new_state.version is not None and new_state.version != old_state.version:
        updated = np.union1d(updated, _updated(store, old_state, new_state, added))
    return Changes(int(since), now.version, added, removed, updated)


def _edited(store: Store, then: EpisodeTable, gone: set[str], new: set[str], both: np.ndarray) -> np.ndarray:
    """Ids of ``both`` (in a gone and a new file) whose scalar row columns differ: edited, not just moved."""
    if not len(both):
        return np.zeros(0, np.int64)
    per_step = {f.key for f in store.schema.step_fields}

    def columns(table: EpisodeTable) -> list[str]:  # each version's own: a schema edit changes every row
        names = pa.schema(table.dt.schema().to_arrow()).names
        return [c for c in names if c not in per_step and not c.startswith("stats/")]

    rows = [_rows_of(table, files, columns(table), both) for table, files in ((then, gone), (store.table, new))]
    return np.asarray(sorted(eid for eid, row in rows[1].items() if rows[0].get(eid) != row), dtype=np.int64)


def _rows_of(table: EpisodeTable, files: set[str], columns: list[str], ids: np.ndarray) -> dict[int, tuple]:
    """Rows (``columns`` as Python values) of episodes ``ids`` stored in ``files`` of ``table``, by id."""
    out: dict[int, tuple] = {}
    partitions = set(table.dt.metadata().partition_columns)
    for rel in sorted(files):
        tbl = read_table_file(table.loc, table.file_path(rel), [c for c in columns if c not in partitions])
        keep = np.isin(np.asarray(tbl["episode_id"], dtype=np.int64), ids)
        where = rel.rsplit("/", 1)[0] if partitions else ""  # hive partition values are in the path, not the file
        for row in tbl.filter(pa.array(keep)).to_pylist():
            out[row["episode_id"]] = (where, *sorted((k, repr(v)) for k, v in row.items()))
    return out


def _updated(store: Store, old: DerivedState, new: DerivedState, added: np.ndarray) -> np.ndarray:
    """Ids live in both versions whose derived values differ between the side versions ``old`` and ``new``."""
    live = np.asarray(store.table.read(["episode_id"]).column(0), dtype=np.int64)
    both = np.setdiff1d(live, added)  # live now and then: live now, not added since
    after = _by_id(side_values(store.location, new), both)
    before = _by_id(side_values(store.location, DerivedState(old.version, new.fields)), both)
    unset = tuple(repr(None) for _ in new.fields)
    changed = [eid for eid, row in after.items() if row != before.get(eid, unset)]
    return np.asarray(sorted(changed), dtype=np.int64)


def _by_id(values: pa.Table, ids: np.ndarray) -> dict[int, tuple[str, ...]]:
    """Each listed episode's derived values, as exact text (NaN equals NaN; -0.0 differs from 0.0)."""
    keep = np.isin(np.asarray(values.column(0), dtype=np.int64), ids)
    values = values.filter(pa.array(keep))
    columns = [values.column(i).to_pylist() for i in range(1, values.num_columns)]
    return {int(eid): tuple(repr(col[i]) for col in columns) for i, eid in enumerate(values.column(0).to_pylist())}
