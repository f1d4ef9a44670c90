"""The verb groups of a Dataset: ``ds.maintenance`` (audit, vacuum, compaction) and ``ds.columns`` (derived columns).

Like delta-rs's ``dt.optimize`` / ``dt.alter``, the verbs a training loop
never calls live on small objects that hold the dataset's store and the
dataset itself (its :meth:`snapshot` commits the dataset's finished episodes
first, so every verb sees them: read-your-writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..core.errors import ArgumentError
from ..core.quality import Check, check_list, with_added
from ..core.schema import FieldSpec
from ..read.audit import CheckReport, audit, bind
from ..read.collection import EpisodeCollection
from ..read.query import SnapshotViews
from ..read.query import where as matching
from ..storage.retention import check_ids
from ..storage.store import Store
from .maintenance import DEFAULT_RETENTION_HOURS, VacuumReport, ValidationReport, vacuum, validate


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
    """``ds.columns``: declare derived columns and set their values, in versioned commits."""

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
        if episode_ids is not None and where is not None:
            raise ArgumentError("update takes episode_ids or where=, not both")
        if where is None and params is not None:
            raise ArgumentError("update: params= fills placeholders of where=; give where= too")
        if not isinstance(values, Mapping) or not values:
            raise ArgumentError("update: values must be a non-empty mapping of derived column keys to values")
        snap = self._dataset.snapshot()
        derived = {f.key: f for f in snap.derived.fields}
        unknown = [k for k in values if k not in derived]
        if unknown:
            raise ArgumentError(f"update: {unknown} are not derived columns (declared: {sorted(derived)})")
        if episode_ids is not None:
            given = list(episode_ids) if not isinstance(episode_ids, str | bytes) else episode_ids
            if len(check_ids(given)) != len(given):
                raise ArgumentError("update: episode_ids repeat")
            ids = np.asarray(given, dtype=np.int64)
            try:
                positions = snap.positions_of(ids)
            except KeyError as exc:
                raise ArgumentError(f"update: {exc.args[0]}") from None
        elif where is not None:
            snap, positions = matching(self._dataset, where, params)
        else:
            positions = np.arange(snap.num_episodes)
        ids = np.asarray(snap.index["episode_id"][positions], dtype=np.int64)
        if not len(ids):
            return self._store.version
        lengths = snap.lengths[positions]
        columns = {key: encode(derived[key], value, lengths, ids) for key, value in values.items()}
        return write(self._store, ids, columns)


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

    def __init__(self, dataset: EpisodeCollection, store: Store) -> None:
        self._dataset, self._store = dataset, store

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
        audited, whatever ``on_fail`` says and however it was committed.
        Writes nothing; a predicate that does not bind is a
        :class:`QueryError` naming its check.
        """
        if where is None and params is not None:
            raise ArgumentError("quality.check: params= fills placeholders of where=; give where= too")
        collection = self._dataset if where is None else self._dataset.where(where, params)
        return audit(collection, checks)
