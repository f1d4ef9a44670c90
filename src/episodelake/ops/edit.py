"""Row edits of committed episodes: trim, split and set meta, each ONE Delta commit that writes no tensor bytes.

An edit replaces the edited episodes' rows of the episode table in one
commit (:meth:`~episodelake.table.EpisodeTable.commit`, the replaceWhere
that FIFO eviction uses: the old rows removed, the new ones added), named in
``history()`` (``TRIM``, ``SPLIT``, ``SET META``). Tensor arrays are never
written: an edited row points into the same rows of its writer's arrays
(``ref/<key>`` shifted by the rows cut from the front, same ``writer``), and
its checksums, statistics and return are recomputed from the rows it keeps
(read once). Older versions keep their files, so time travel and readers
pinned to them see the episodes as they were.

Rules (docs/writing.md, "Editing episodes"):

* **trim** keeps transitions ``[start, stop)`` and observations
  ``[start, stop]`` (at least one transition). ``terminated`` stays only when
  ``stop`` is the old end; a cut end is ``truncated``. The id, ``created_at``
  (so the position) and meta stay.
* **split** at ``at`` makes ``[0, at)`` (truncated) and ``[at, T)`` (the
  original flags), meta and ``created_at`` copied, two new ids. Edit ids live
  where no writer's can: writers mint ``number << 32 | sequence`` with a
  31-bit number, so every writer id is >= 0; an edit mints
  ``-2**63 + (number << 32 | sequence)`` (negative), with a random 31-bit
  edit number not used by any negative id in the table.
* **set_meta** replaces base meta values (partition columns too), checked as
  a write checks them.

The plan is checked again at the version the commit lands on: an edited
episode deleted or changed meanwhile raises :class:`CommitConflictError`
and changes nothing. Derived columns are keyed by episode id: trim and
set_meta keep per-episode derived values; a split copies them to its halves
(per-step rows cut at ``at``) in a side-table update just before its commit;
trim refuses a dataset with per-step derived columns (the episode-table
property that would make cut values visible cannot change in the commit that
cuts the rows).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.checks import meta_value, plain
from ..core.episode import EpisodeBatch, concat_rows, extra_rows
from ..core.errors import ArgumentError, CommitConflictError, QualityError, ValidationError
from ..core.schema import DatasetSchema, FieldSpec
from ..core.summary import TASK_BYTES, run_inline, summarize
from ..read.snapshot import Snapshot
from ..storage.rows import build_rows, meta_column
from ..storage.store import Store
from ..storage.table import arrow_schema
from ..write import derived
from ..write.commit import run_pooled

EDIT_ID_BASE = -(1 << 63)  # edit ids: EDIT_ID_BASE + (edit number << 32 | sequence), all < 0
ID_LIST_MAX = 64  # more edited episodes than this are replaced over their id range (table.commit's span)
BLOCK_BYTES = 256 << 20  # kept rows read and summarized at once: memory stays bounded whatever the edit


@dataclass(frozen=True)
class EditReport:
    """What an edit changed (or, with ``dry_run``, would change).

    ``episode_ids``: the edited episodes (removed by a split); ``new_ids``:
    the episodes a split made (empty otherwise); ``steps_removed``: steps
    trimmed away; ``version``: the version committed (the current one for a
    dry run or an edit that matched nothing).
    """

    operation: str
    version: int
    dry_run: bool
    episode_ids: list[int] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)
    steps_removed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "version": self.version,
            "dry_run": self.dry_run,
            "episode_ids": self.episode_ids,
            "new_ids": self.new_ids,
            "steps_removed": self.steps_removed,
        }


def trim(
    store: Store,
    snap: Snapshot,
    positions: np.ndarray,
    cuts: np.ndarray,
    dry_run: bool,
    head_tail: tuple[int, int] | None = None,
) -> EditReport:
    """Keep transitions ``[cuts[i, 0], cuts[i, 1])`` of the episode at ``positions[i]``, in one commit.

    ``head_tail``: the ``(head, tail)`` the cuts were made from, for the
    error. A bad bound is an :class:`ArgumentError` naming the episode, the
    bound and the episode's length, before anything is read or written.
    """
    ids = [int(i) for i in snap.index["episode_id"][positions]]
    lengths = snap.lengths[positions]
    for eid, t, (a, b) in zip(ids, lengths.tolist(), cuts.tolist(), strict=True):
        problem = _trim_problem(t, a, b, head_tail)
        if problem:
            raise ArgumentError(f"trim: episode {eid} has {t} transitions; {problem}")
    _refuse_per_step_derived(snap)
    removed = int((lengths - (cuts[:, 1] - cuts[:, 0])).sum())
    if dry_run or not ids:
        return EditReport("TRIM", store.version, True, ids, [], removed) if dry_run else _nothing("TRIM", store)
    span = len(ids) > ID_LIST_MAX
    old, others = _current_rows(store, ids, span)
    cut_end = cuts[:, 1] < lengths
    terminated = snap.index["terminated"][positions] & ~cut_end
    truncated = snap.index["truncated"][positions] | cut_end
    rows = _edited_rows(store, snap, old, positions, cuts, terminated, truncated, np.asarray(ids, np.int64))
    version = _commit(store, old, others, rows, "TRIM", span)
    return EditReport("TRIM", version, False, ids, [], removed)


def _trim_problem(t: int, start: int, stop: int, head_tail: tuple[int, int] | None) -> str:
    """What is wrong with keeping ``[start, stop)`` of ``t`` transitions ("" when nothing is)."""
    if head_tail is not None:
        head, tail = head_tail
        if head + tail >= t:
            return f"head={head} and tail={tail} would remove {head + tail} of them: a trim must keep at least one"
        return ""
    if stop > t:
        return f"stop {stop} is past the episode's {t} steps (stop must be at most {t})"
    if start < 0:
        return f"start {start} is negative (transitions are numbered from 0)"
    if start >= t:
        return f"start {start} is at or past the episode's {t} steps: the trim must keep at least one transition"
    if stop <= start:
        return f"[{start}, {stop}) is empty: stop must be above start (a trim must keep at least one transition)"
    return ""


def split(store: Store, snap: Snapshot, position: int, at: int, dry_run: bool) -> EditReport:
    """Replace the episode at ``position`` by its transitions ``[0, at)`` (truncated) and ``[at, T)``."""
    eid = int(snap.index["episode_id"][position])
    t = int(snap.lengths[position])
    if isinstance(at, bool) or not isinstance(at, int | np.integer) or not 0 < at < t:
        if t < 2:
            raise ArgumentError(f"split: episode {eid} has 1 transition; a 1-transition episode cannot be split")
        if isinstance(at, bool) or not isinstance(at, int | np.integer):
            why = f"got {type(at).__name__} {plain(at)!r}"
        elif at > t:
            why = f"{at} is past the episode's {t} steps"
        elif at == t:
            why = "the second half would be empty"
        else:
            why = "the first half would be empty" if at == 0 else f"{at} is negative"
        raise ArgumentError(
            f"split: episode {eid} has {t} transitions; at={plain(at)!r} must be an int in [1, {t - 1}] ({why})"
        )
    capacity = store.capacity
    if capacity is not None and capacity.episodes is not None and snap.num_episodes + 1 > capacity.episodes:
        raise ArgumentError(
            f"split: episode {eid}: the dataset keeps at most {capacity.episodes} episodes and holds "
            f"{snap.num_episodes}; a split would exceed its capacity"
        )
    if dry_run:
        return EditReport("SPLIT", store.version, True, [eid], [], 0)
    new_ids = _edit_ids(store, 2)
    _split_derived(store, snap, position, at, new_ids)
    old, others = _current_rows(store, [eid])
    positions = np.array([position, position])
    cuts = np.array([[0, at], [at, t]], dtype=np.int64)
    terminated = np.array([False, bool(snap.index["terminated"][position])])
    truncated = np.array([True, bool(snap.index["truncated"][position])])
    rows = _edited_rows(store, snap, old, positions, cuts, terminated, truncated, new_ids)
    version = _commit(store, old, others, rows, "SPLIT", False)
    return EditReport("SPLIT", version, False, [eid], new_ids.tolist(), 0)


def set_meta(
    store: Store, snap: Snapshot, values: Mapping[str, Any], positions: np.ndarray, dry_run: bool
) -> EditReport:
    """Set base meta fields of the episodes at ``positions`` (one value each, or one per episode) in one commit.

    A value that is a list or tuple of as many items as episodes (and is not
    itself a valid value of the field) gives each episode its own.
    """
    schema = snap.schema
    if not isinstance(values, Mapping) or not values:
        raise ArgumentError("set_meta: values must be a non-empty mapping of meta field names to values")
    meta = {f.key: f for f in schema.meta_fields}
    for key in values:
        f = meta.get(key) if isinstance(key, str) else None
        if f is None:
            kinds = "a step field" if isinstance(key, str) and key in {g.key for g in schema.fields} else "unknown"
            raise ArgumentError(f"set_meta: {key!r} is {kinds}, not a meta field (meta fields: {sorted(meta)})")
        if f.derived:
            raise ArgumentError(f"set_meta: {key!r} is a derived column; set it with ds.columns.update")
    ids = [int(i) for i in snap.index["episode_id"][positions]]
    checked = {key: _meta_values(schema, key, value, ids) for key, value in values.items()}
    for key, (stacked, valid) in checked.items():
        _check_bounds(meta[key], stacked, valid, ids)
    if dry_run or not ids:
        return EditReport("SET META", store.version, True, ids) if dry_run else _nothing("SET META", store)
    span = len(ids) > ID_LIST_MAX
    old, others = _current_rows(store, ids, span)
    chosen = np.asarray(ids, dtype=np.int64)
    sorter = np.argsort(chosen)
    at = sorter[np.searchsorted(chosen, old["episode_id"].to_numpy(), sorter=sorter)]  # old's row -> ids' index
    target = arrow_schema(store.schema)
    rows = old
    for key, (stacked, valid) in checked.items():
        column = meta_column(meta[key], stacked[at], valid[at], target.field(key).type)
        rows = rows.set_column(rows.schema.get_field_index(key), target.field(key), column)
    version = _commit(store, old, others, rows, "SET META", span)
    return EditReport("SET META", version, False, ids)


def _meta_values(schema: DatasetSchema, key: str, value: Any, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``value`` (one for all, or one per episode) of meta field ``key`` for ``ids``, checked: (values, valid)."""
    f = schema[key]
    n = len(ids)
    per_episode = isinstance(value, list | tuple) and len(value) == n and not _is_value(f, value)
    if per_episode:
        checked = [meta_value(f, v, f"set_meta of episode {eid}") for v, eid in zip(value, ids, strict=True)]
    else:  # one value for all: checked once (as the first episode's), broadcast below
        checked = [meta_value(f, value, f"set_meta of episode {ids[0]}")] if n else []
    if f.required:
        if per_episode:
            unset = [eid for v, eid in zip(checked, ids, strict=True) if v is None]
        else:
            unset = ids if checked == [None] else []
        if unset:
            raise ValidationError(f"set_meta: meta field {key!r} is required; episodes {unset[:10]} would have none")
    valid = np.broadcast_to(np.array([v is not None for v in checked], dtype=bool), (n,)).copy()
    if f.np_dtype.kind == "U":
        return np.broadcast_to(np.array([v or "" for v in checked], dtype=object), (n,)).copy(), valid
    stacked = np.zeros((len(checked), *f.shape), f.np_dtype)
    for i, v in enumerate(checked):
        if v is not None:
            stacked[i] = v
    return np.broadcast_to(stacked, (n, *f.shape)).copy(), valid


@np.errstate(invalid="ignore")
def _check_bounds(f: FieldSpec, stacked: np.ndarray, valid: np.ndarray, ids: list[int]) -> None:
    """:class:`QualityError` for the first new value outside ``f``'s ``min``/``max`` (as a write: NULL passes, NaN
    fails), naming the episode and the value.

    A bound with ``on_fail="warn"`` lets the value through; ``"quarantine"``
    refuses it as ``"reject"`` does (an edit never quarantines an episode).
    """
    if not ids:
        return
    rows = np.asarray(stacked).reshape(len(ids), -1)
    for bound in ("min", "max"):
        limit = getattr(f, bound, None)
        if limit is None or f.on_fail_of(bound) == "warn":
            continue
        bad = ~(rows >= limit if bound == "min" else rows <= limit).all(axis=1) & valid
        if bad.any():
            i = int(np.argmax(bad))
            value = plain(np.asarray(stacked)[i])
            held = " (on_fail='quarantine': an edit does not quarantine)" if f.on_fail_of(bound) == "quarantine" else ""
            raise QualityError(
                f"set_meta of episode {ids[i]}: meta field {f.key!r} fails {bound}={limit!r} (value {value!r}){held}; "
                "nothing was edited",
                check=f"{f.key}: {bound}",
                episode=i,
            )


def _is_value(f: Any, value: Any) -> bool:
    """Whether ``value`` is itself one valid value of meta field ``f`` (a shaped field takes a list)."""
    try:
        meta_value(f, value, "")
    except (ValidationError, ArgumentError, TypeError, ValueError):
        return False
    return True


def _refuse_per_step_derived(snap: Snapshot) -> None:
    fields = [f.key for f in snap.derived.fields if f.role != "meta"]
    if fields:
        raise ArgumentError(
            f"trim: the dataset declares per-step derived columns {fields}, whose values cannot be cut in the "
            "commit that cuts the episodes"
        )


def _split_derived(store: Store, snap: Snapshot, position: int, at: int, new_ids: np.ndarray) -> None:
    """Give a split's halves the episode's derived values: per-episode ones copied, per-step rows cut at ``at``.

    One side-table update (``UPDATE`` in history) before the split's commit:
    its rows belong to ids no version holds yet, so it changes nothing any
    reader sees; a crash before the split leaves them unread.
    """
    if not snap.derived.fields:
        return
    row = snap.derived_values().slice(position, 1)
    columns = {}
    for f in snap.derived.fields:
        value = row.column(f.key)[0]
        if not value.is_valid:
            columns[f.key] = pa.nulls(2, f.arrow_type())
        elif f.role == "meta":
            columns[f.key] = pa.array([value.as_py()] * 2, f.arrow_type())
        else:
            rows = value.as_py()
            columns[f.key] = pa.array([rows[: at + extra_rows(f)], rows[at:]], f.arrow_type())
    if any(column.null_count < 2 for column in columns.values()):
        derived.write(store, new_ids, columns)


def _nothing(operation: str, store: Store) -> EditReport:
    return EditReport(operation, store.version, False)


def _columns(store: Store) -> pa.Schema:
    """The episode table's columns as an edit reads and writes them: the schema's, then any others the table has."""
    target = arrow_schema(store.schema)
    extra = [f for f in pa.schema(store.table.dt.schema().to_arrow()) if f.name not in target.names]
    return pa.schema([*target, *extra])


def _current_rows(store: Store, ids: list[int], span: bool = False) -> tuple[pa.Table, pa.Table]:
    """The loaded version's rows of episodes ``ids`` (by id) and, with ``span``, the other rows of their id range.

    Raises :class:`CommitConflictError` when one of ``ids`` is gone.
    """
    target = _columns(store)
    column = pc.field("episode_id")
    if span:
        where = (column >= min(ids)) & (column <= max(ids))
    else:
        where = column.isin(pa.array(ids, pa.int64()))
    tbl = store.table.read(target.names, filter=where).select(target.names).cast(target)
    mine = pc.is_in(tbl["episode_id"], pa.array(ids, pa.int64()))
    found, others = tbl.filter(mine), tbl.filter(pc.invert(mine))
    if found.num_rows != len(ids):
        gone = sorted(set(ids) - set(found["episode_id"].to_pylist()))
        raise CommitConflictError(f"episodes {gone[:10]} are no longer in the latest version: nothing was edited")
    return found.sort_by("episode_id").combine_chunks(), others


def _edited_rows(
    store: Store,
    snap: Snapshot,
    old: pa.Table,
    positions: np.ndarray,
    cuts: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    ids: np.ndarray,
) -> pa.Table:
    """New table rows for episodes ``positions`` cut to ``cuts`` (row ``i``: ``ids[i]``; writer, meta and any
    other columns of the episode's row in ``old``), built block by block of at most :data:`BLOCK_BYTES` rows.

    Reads the kept rows of every step field (tensors are read, never written),
    recomputes checksums, statistics and returns, and shifts the references.
    """
    schema = store.schema
    lengths = (cuts[:, 1] - cuts[:, 0]).astype(np.int64)
    step_bytes = sum(f.step_bytes for f in schema.step_fields)
    sizes = np.cumsum((lengths + 1) * max(1, step_bytes))
    by_id = {int(e): i for i, e in enumerate(old["episode_id"].to_pylist())}
    source = old.take(pa.array([by_id[int(e)] for e in snap.index["episode_id"][positions]], pa.int64()))
    blocks, a = [], 0
    while a < len(ids):
        b = max(a + 1, int(np.searchsorted(sizes, (sizes[a - 1] if a else 0) + BLOCK_BYTES, side="right")))
        rows = _block_rows(schema, snap, positions[a:b], cuts[a:b], terminated[a:b], truncated[a:b], ids[a:b])
        for name in ["writer", *(f.key for f in schema.meta_fields)]:
            rows = rows.set_column(rows.schema.get_field_index(name), name, source[name][a:b])
        for f in source.schema:  # columns beyond the schema's (quality columns) stay as they were
            if f.name not in rows.schema.names:
                rows = rows.append_column(f, source[f.name][a:b])
        blocks.append(rows)
        a = b
    target = _columns(store)
    return pa.concat_tables(blocks).select(target.names).cast(target).combine_chunks()


def _block_rows(
    schema: DatasetSchema,
    snap: Snapshot,
    positions: np.ndarray,
    cuts: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    ids: np.ndarray,
) -> pa.Table:
    """The rows of one block of :func:`_edited_rows` (writer and meta left empty: the caller sets them)."""
    lengths = (cuts[:, 1] - cuts[:, 0]).astype(np.int64)
    data, refs = {}, {}
    pos = positions.tolist()
    for f in schema.step_fields:
        hi = (cuts[:, 1] + extra_rows(f)).tolist()
        data[f.key] = concat_rows(snap.read_ranges(f, pos, cuts[:, 0].tolist(), hi))
        if f.in_tensor:
            refs[f.key] = snap.index[f"ref/{f.key}"][positions].astype(np.int64) + cuts[:, 0]
    n = len(ids)
    created = snap.index["created_at"][positions].astype("datetime64[us]")
    unset = {
        f.name: (np.zeros((n, *f.shape), object if f.np_dtype.kind == "U" else f.np_dtype), np.zeros(n, bool))
        for f in schema.meta_fields
    }
    batch = EpisodeBatch(data, lengths, terminated.astype(bool), truncated.astype(bool), unset, created)
    summary = summarize(schema, batch, run_pooled if batch.nbytes >= TASK_BYTES else run_inline)
    return build_rows(schema, batch, summary, "", ids, refs)


def _edit_ids(store: Store, n: int) -> np.ndarray:
    """``n`` new edit ids (increasing): a random 31-bit edit number no negative id of the latest version uses."""
    ids = np.asarray(store.table.read(["episode_id"]).column(0), dtype=np.int64)
    used = set(((ids[ids < 0] - EDIT_ID_BASE) >> 32).tolist())
    number = secrets.randbelow(1 << 31)
    while number in used:
        number = secrets.randbelow(1 << 31)
    return EDIT_ID_BASE + ((number << 32) | np.arange(n, dtype=np.int64))


def _commit(store: Store, old: pa.Table, others: pa.Table, rows: pa.Table, operation: str, span: bool) -> int:
    """Replace the episodes of ``old`` by ``rows`` in one commit; the latest version must still hold ``old``.

    ``span`` (many episodes kept under their ids, :data:`ID_LIST_MAX`): they
    are replaced over their id range, whose other rows ``others`` (read with
    ``old``) are rewritten unchanged; otherwise by an id list. Only when a
    commit landed since ``old`` was read are the rows read again (once).
    """
    ids = old["episode_id"].to_pylist()
    read_at = store.table.version  # the version ``old`` and ``others`` were read at

    def plan() -> tuple[pa.Table, list[int]]:
        nonlocal others
        if store.table.version != read_at:
            now, others = _current_rows(store, ids, span)
            if not now.equals(old):
                raise CommitConflictError(f"{operation}: episodes {ids[:10]} changed concurrently: nothing was edited")
        return (pa.concat_tables([others, rows]) if span else rows), ids

    stamp = store.table.schema_stamp()  # the fields the rows were built under: a schema edit since refuses them
    version = store.table.commit(plan, operation=operation, stamp=stamp, span=span)
    store.committed()
    return version
