"""The verb groups of a Dataset: ``ds.maintenance`` (audit, vacuum, compaction), ``ds.columns`` (derived
columns) and ``ds.edit`` (trim, split, set meta).

Like delta-rs's ``dt.optimize`` / ``dt.alter``, the verbs a training loop
never calls live on small objects that hold the dataset's store and the
dataset itself (its :meth:`snapshot` commits the dataset's finished episodes
first, so every verb sees them: read-your-writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..core.errors import ArgumentError
from ..core.quality import Check, check_list, with_added
from ..core.schema import FieldSpec
from ..read.audit import CheckReport, audit, bind, merged
from ..read.collection import EpisodeCollection
from ..read.query import SnapshotViews
from ..read.query import where as matching
from ..read.snapshot import Snapshot
from ..storage.retention import check_ids
from ..storage.rows import QUARANTINED
from ..storage.store import Store
from . import edit
from .edit import EditReport
from .maintenance import DEFAULT_RETENTION_HOURS, VacuumReport, ValidationReport, vacuum, validate
from .schema_edit import SchemaEditReport, drop_fields, rename_field


def check_choice(verb: str, episode_ids: Iterable[int] | None, where: str | None, params: Any) -> None:
    """:class:`ArgumentError` for ``episode_ids`` with ``where``, or ``params`` without ``where``."""
    if episode_ids is not None and where is not None:
        raise ArgumentError(f"{verb} takes episode_ids or where=, not both")
    if where is None and params is not None:
        raise ArgumentError(f"{verb}: params= fills placeholders of where=; give where= too")


def chosen(
    dataset: EpisodeCollection, verb: str, episode_ids: Iterable[int] | None, where: str | None, params: Any
) -> tuple[Snapshot, np.ndarray]:
    """The snapshot and positions a verb acts on: ``episode_ids`` (in that order), ``where`` matches, else all.

    ``episode_ids`` and ``where`` together, ``params`` without ``where``,
    repeated or unknown ids raise :class:`ArgumentError` naming ``verb``.
    """
    check_choice(verb, episode_ids, where, params)
    if where is not None:
        return matching(dataset, where, params)
    snap = dataset.snapshot()
    if episode_ids is None:
        return snap, np.arange(snap.num_episodes)
    given = list(episode_ids) if not isinstance(episode_ids, str | bytes) else episode_ids
    if len(check_ids(given)) != len(given):
        raise ArgumentError(f"{verb}: episode_ids repeat")
    try:
        return snap, snap.positions_of(np.asarray(given, dtype=np.int64))
    except KeyError as exc:
        raise ArgumentError(f"{verb}: {exc.args[0]}") from None


class Maintenance:
    """``ds.maintenance``: the audit, vacuum and compaction of a dataset, and what its root holds."""

    def __init__(self, dataset: EpisodeCollection, store: Store) -> None:
        self._dataset, self._store = dataset, store

    @property
    def descriptor(self) -> dict[str, Any]:
        """The descriptor stored at the dataset's root: format, schema, partitioning, capacity, info, versions."""
        return self._store.descriptor

    @property
    def read_only(self) -> bool:
        """True when the dataset writes nothing: opened ``read_only=True`` or at a past version."""
        return self._store.read_only

    def validate(self, tensors: bool = True) -> ValidationReport:
        """Audit this version: table files, log, every episode's lengths, flags, stats and tensor checksums.

        Returns a report (``report.ok``, ``report.problems``); ``report.raise_if_failed()``
        turns problems into a :class:`CorruptionError`. ``tensors=False`` skips
        reading tensor rows. Writes nothing.
        """
        self._dataset.snapshot()  # read-your-writes: audit the version holding the finished episodes
        return validate(self._store, tensors=tensors)

    def vacuum(
        self, dry_run: bool = False, retention_hours: float | None = None, *, break_old_versions: bool = False
    ) -> VacuumReport:
        """Delete unreferenced table files and crash leftovers in the tensors (see :mod:`.maintenance`).

        Versions superseded less than ``retention_hours`` (default 168) ago
        stay whole; data no version references (a concurrent writer's
        uncommitted files) goes only once older than 1 h, whatever the
        retention. A retention below 1 h needs ``break_old_versions=True``
        (:class:`ArgumentError` otherwise): time travel to the versions it
        drops, and readers pinned to them, then fail. ``dry_run=True`` lists
        what would go and deletes nothing.
        """
        hours = DEFAULT_RETENTION_HOURS if retention_hours is None else retention_hours
        return vacuum(self._store, dry_run=dry_run, retention_hours=hours, break_old_versions=break_old_versions)

    def compact(self) -> None:
        """Merge small table files and checkpoint the log (:class:`ReadOnlyError` on a read-only dataset)."""
        self._store.check_writable()
        self._store.table.compact()


class Columns:
    """``ds.columns``: declare derived columns and set their values; drop and rename fields. Versioned commits."""

    def __init__(self, dataset: EpisodeCollection, store: Store) -> None:
        self._dataset, self._store = dataset, store

    def add(self, *specs: FieldSpec) -> int:
        """Declare derived columns (``FieldSpec``, taken as ``derived=True``) in one commit; return the version.

        Per-episode columns have ``role="meta"``, per-step ones a step role.
        They read NULL in SQL (a step column's ``default``, else NaN/0, in
        arrays) until :meth:`update` sets them. A key that is already a field
        raises :class:`SchemaError`; declaring a column again changes nothing.
        """
        from ..write.derived import declare

        self._store.check_writable()
        if not specs:
            raise ArgumentError("columns.add needs at least one FieldSpec")
        return declare(self._store, self._dataset.snapshot().schema, specs)

    def update(
        self,
        values: Mapping[str, Any],
        episode_ids: Iterable[int] | None = None,
        *,
        where: str | None = None,
        params: Any = None,
    ) -> int:
        """Set derived columns of some episodes in one versioned update; return the new table version.

        ``values`` maps derived column keys to values for the chosen episodes:
        ``episode_ids`` (values in that order), those matching ``where`` (SQL
        over ``episodes``, ``params`` bind its placeholders; values in episode
        order) or, with neither, every episode (episode order). A per-episode
        column takes one value per episode (None: unset); a per-step column
        one array per episode, of its rows, or one array of all their rows.
        Base rows and tensors are never rewritten. Bad columns, values or ids
        raise (naming the column and episode) and change nothing; a concurrent
        update by another process either lands too or raises
        :class:`~episodelake.errors.CommitConflictError`.
        """
        from ..write.derived import encode, write

        self._store.check_writable()
        check_choice("update", episode_ids, where, params)  # before the values: the call's shape first
        if not isinstance(values, Mapping) or not values:
            raise ArgumentError("update: values must be a non-empty mapping of derived column keys to values")
        snap = self._dataset.snapshot()
        derived = {f.key: f for f in snap.derived.fields}
        unknown = [k for k in values if k not in derived]
        if unknown:
            raise ArgumentError(f"update: {unknown} are not derived columns (declared: {sorted(derived)})")
        snap, positions = chosen(self._dataset, "update", episode_ids, where, params)
        ids = np.asarray(snap.index["episode_id"][positions], dtype=np.int64)
        if not len(ids):
            return self._store.version
        lengths = snap.lengths[positions]
        columns = {key: encode(derived[key], value, lengths, ids) for key, value in values.items()}
        return write(self._store, ids, columns)

    def drop(self, *keys: str, dry_run: bool = False) -> SchemaEditReport:
        """Drop fields (meta, per-step or tensor) in one commit (``DROP FIELDS``) that rewrites only table rows.

        Every episode keeps its other fields; older versions (time travel,
        pinned readers) still read the dropped ones; tensor arrays are left as
        they are. Derived and partition columns, unknown keys
        (:class:`ArgumentError`) and a drop leaving no observation, action or
        reward field (:class:`SchemaError`) change nothing. Rules:
        :mod:`episodelake.ops.schema_edit`.
        """
        if not dry_run:
            self._store.check_writable()
        return drop_fields(self._store, self._dataset.snapshot(), list(keys), dry_run)

    def rename(self, old: str, new: str, *, dry_run: bool = False) -> SchemaEditReport:
        """Rename field ``old`` to key ``new`` (same role) in one commit (``RENAME FIELD``); tensors stay.

        SQL, ``where()``, reads, ``stats()``, sampling and new episodes use
        the new key; older versions read the old one. Same refusals as :meth:`drop`.
        """
        if not dry_run:
            self._store.check_writable()
        return rename_field(self._store, self._dataset.snapshot(), old, new, dry_run)


def bound_checks(collection: EpisodeCollection, checks: Iterable[Check]) -> tuple[Check, ...]:
    """``checks`` as a tuple once each binds over ``collection``'s views (else :class:`QueryError` naming it)."""
    chosen = check_list(checks)
    bind(SnapshotViews(collection, collection.snapshot()), chosen)
    return chosen


class Quality:
    """``ds.quality``: the quality checks stored with the dataset (versioned) and audits against them.

    Checks live in the episode table's properties, so every version carries
    its own: ``Dataset.open(path, version=v).quality.list()`` is the checks of
    ``v``. Each :meth:`add`/:meth:`drop` is one commit (``ADD CHECK``/``DROP
    CHECK`` in ``history()``); a refused call commits nothing.
    """

    def __init__(
        self, dataset: EpisodeCollection, store: Store, view: Callable[[Snapshot, np.ndarray], Any] | None = None
    ) -> None:
        self._dataset, self._store, self._view = dataset, store, view

    def list(self) -> tuple[Check, ...]:
        """The checks stored with this version, in the order they were added."""
        return self._dataset.snapshot().checks

    def add(self, *checks: Check) -> int:
        """Store ``checks`` with the dataset in one commit; return the new table version.

        Each predicate must bind over the current ``episodes``/``steps`` views
        (:class:`QueryError` naming the check otherwise); a name already taken
        by a different check is an :class:`ArgumentError` (drop it first);
        adding a check equal to a stored one changes nothing. Episodes already
        stored are not re-checked: :meth:`check` audits them.
        """
        from ..write.quality import record_checks

        self._store.check_writable()
        if not checks:
            raise ArgumentError("quality.add needs at least one Check")
        given = bound_checks(self._dataset, checks)
        with_added(self.list(), given)  # a clash with a stored check is refused before anything is written
        return record_checks(self._store, lambda current: with_added(current, given), "ADD CHECK")

    def drop(self, name: str) -> int:
        """Remove the stored check ``name`` in one commit; return the new version (:class:`ArgumentError`: none)."""
        from ..write.quality import record_checks

        self._store.check_writable()
        stored = [c.name for c in self.list()]
        if name not in stored:
            raise ArgumentError(f"quality.drop: no check named {name!r} (stored: {stored})")
        return record_checks(self._store, lambda current: tuple(c for c in current if c.name != name), "DROP CHECK")

    def check(self, checks: Iterable[Check] | None = None, where: str | None = None, params: Any = None) -> CheckReport:
        """Audit this version's episodes against ``checks`` (None: the stored ones); a :class:`CheckReport`.

        ``where`` (SQL over ``episodes``, ``params`` bind its placeholders)
        audits only the episodes it matches. Every episode of the version is
        audited, whatever ``on_fail`` says and however it was committed:
        quarantined episodes too (they fail a check by definition, and a
        released one is audited like any other). Writes nothing; a predicate
        that does not bind is a :class:`QueryError` naming its check.
        """
        if where is None and params is not None:
            raise ArgumentError("quality.check: params= fills placeholders of where=; give where= too")
        parts: tuple[EpisodeCollection, ...] = (self._dataset,)
        if self._view is not None and QUARANTINED in self._dataset.snapshot().arrow_dataset().schema.names:
            parts = (*parts, self.quarantine())
        chosen = [p if where is None else p.where(where, params) for p in parts]
        return merged([audit(c, checks) for c in chosen])

    def quarantine(self) -> Any:
        """A view (``DatasetView``) of this version's quarantined episodes: committed, but left out of ``len``,
        reads, SQL, ``stats()`` and sampling of the dataset. Their reads and SQL work on the view (its
        ``episodes`` view shows ``checks_failed``); :meth:`release` or ``ds.delete(ids)`` ends the quarantine.
        """
        assert self._view is not None, "a Dataset makes its Quality with its view factory"
        self._dataset.snapshot()  # read-your-writes: commit this object's pending episodes first
        held = Snapshot(self._store, quarantined=True)
        return self._view(held, np.arange(held.num_episodes))

    def release(self, episode_ids: Iterable[int]) -> int:
        """Put the quarantined ``episode_ids`` back among the dataset's episodes in one commit; the new version.

        Ids that are not quarantined in this version are an :class:`ArgumentError` and nothing changes.
        """
        from ..write.gate import release

        self._store.check_writable()
        ids = check_ids(episode_ids)
        held = self.quarantine().snapshot().index["episode_id"]
        unknown = ids[~np.isin(ids, held)]
        if len(unknown) or not len(ids):
            raise ArgumentError(
                f"quality.release: {len(unknown)} episode id(s) are not quarantined in version "
                f"{self._store.version}: {unknown[:10].tolist()}"
                if len(ids)
                else "quality.release needs episode ids"
            )
        return release(self._store, np.unique(ids).tolist())


class Edit:
    """``ds.edit``: trim, split and relabel committed episodes, each one commit that writes no tensor bytes.

    Every edit replaces the edited episodes' table rows in one commit named
    in ``history()`` (``TRIM``, ``SPLIT``, ``SET META``); readers pinned to
    an older version, and time travel, see the episodes as they were. Bad
    arguments raise (naming the episode or field) and commit nothing;
    ``dry_run=True`` reports what would change and commits nothing. Rules:
    :mod:`episodelake.ops.edit` and docs/writing.md.
    """

    def __init__(self, dataset: EpisodeCollection, store: Store) -> None:
        self._dataset, self._store = dataset, store

    def trim(
        self,
        cuts: Mapping[int, tuple[int, int]] | None = None,
        *,
        head: int = 0,
        tail: int = 0,
        where: str | None = None,
        params: Any = None,
        dry_run: bool = False,
    ) -> EditReport:
        """Keep transitions ``[start, stop)`` (observations ``[start, stop]``) of some episodes.

        ``cuts`` maps episode ids to ``(start, stop)``; without it, ``head``
        steps go from the start and ``tail`` from the end of every episode
        matching ``where`` (SQL over ``episodes``, ``params`` bind it; none:
        every episode). ``terminated`` stays only where ``stop`` is the old
        end; a cut end is ``truncated``. Ids, positions and meta stay.
        """
        if not dry_run:  # a dry run reads only: it works on a read-only dataset too
            self._store.check_writable()
        if cuts is not None:
            if where is not None or params is not None or head or tail:
                raise ArgumentError("trim takes cuts, or head=/tail= with where=/params=, not both")
            if not isinstance(cuts, Mapping):
                raise ArgumentError(f"trim: cuts must map episode ids to (start, stop), got {type(cuts).__name__}")
            spans = [_span(eid, span) for eid, span in cuts.items()]
            snap, positions = chosen(self._dataset, "trim", list(cuts), None, None)
            bounds = np.array(spans, dtype=np.int64).reshape(-1, 2)
        else:
            for name, value in (("head", head), ("tail", tail)):
                if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                    raise ArgumentError(f"trim: {name} must be an int >= 0, got {value!r}")
            if not head and not tail:
                raise ArgumentError("trim needs cuts, or head= and/or tail= steps to remove")
            snap, positions = chosen(self._dataset, "trim", None, where, params)
            lengths = snap.lengths[positions].astype(np.int64)
            bounds = np.stack([np.full(len(positions), head, np.int64), lengths - tail], axis=1)
            return edit.trim(self._store, snap, positions, bounds, dry_run, head_tail=(int(head), int(tail)))
        return edit.trim(self._store, snap, positions, bounds, dry_run)

    def split(self, episode_id: int, at: int, *, dry_run: bool = False) -> EditReport:
        """Replace episode ``episode_id`` by its transitions ``[0, at)`` (truncated) and ``[at, T)`` (its flags).

        Both keep the meta and ``created_at``; ``report.new_ids`` names them
        (new ids, increasing: the first half first).
        """
        if not dry_run:  # a dry run reads only: it works on a read-only dataset too
            self._store.check_writable()
        snap, positions = chosen(self._dataset, "split", [_episode_id(episode_id)], None, None)
        return edit.split(self._store, snap, int(positions[0]), at, dry_run)

    def set_meta(
        self,
        values: Mapping[str, Any],
        episode_ids: Iterable[int] | None = None,
        *,
        where: str | None = None,
        params: Any = None,
        dry_run: bool = False,
    ) -> EditReport:
        """Set base meta fields (task labels, operator, success; partition columns too) of some episodes.

        ``values`` maps meta field names to one value for all chosen
        episodes, or a list of one value per episode (in ``episode_ids``
        order, or episode order); None unsets. The episodes: ``episode_ids``,
        those matching ``where`` (``params`` bind it), or every episode.
        Values are checked as a write checks them; unknown, step and derived
        fields raise :class:`ArgumentError` (derived: ``columns.update``).
        """
        if not dry_run:  # a dry run reads only: it works on a read-only dataset too
            self._store.check_writable()
        snap, positions = chosen(self._dataset, "set_meta", episode_ids, where, params)
        return edit.set_meta(self._store, snap, values, positions, dry_run)


def _episode_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentError(f"episode id must be an int, got {value!r}")
    return int(value)


def _span(eid: Any, span: Any) -> tuple[int, int]:
    """A trim's ``(start, stop)`` for episode ``eid``, as two ints."""
    _episode_id(eid)
    ok = isinstance(span, tuple | list) and len(span) == 2
    if not ok or any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in span):
        raise ArgumentError(f"trim: episode {eid}: (start, stop) must be two ints, got {span!r}")
    return int(span[0]), int(span[1])
