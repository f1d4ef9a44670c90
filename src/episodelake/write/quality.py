"""Storing quality checks: one metadata commit of the episode table per change, named in history.

The checks live in the table property :data:`~episodelake.core.quality.CHECKS_KEY`
(see :mod:`episodelake.core.quality`), so each table version carries its own.
A change is a read-modify-write of that property, committed as the derived
columns' record is (:func:`episodelake.write.derived._retry`): re-read after
the commit, and retried while a concurrent commit overwrote it, so two
processes adding different checks both land.
"""

from __future__ import annotations

from collections.abc import Callable

from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError

from ..core.quality import CHECKS_KEY, Check, checks_to_json, stored_checks
from ..storage.store import Store
from ..storage.table import OPERATION_KEY
from .derived import _retry

Change = Callable[[tuple[Check, ...]], tuple[Check, ...]]


def record_checks(store: Store, change: Change, operation: str) -> int:
    """Commit ``change(current checks)`` as the stored checks; return the table version that holds them.

    ``change`` must be idempotent (applied to its own result it changes
    nothing): a re-read that shows it applied ends the retries, and a change
    that changes nothing commits nothing. ``operation`` names the commit in
    ``history()`` (``ADD CHECK``, ``DROP CHECK``).
    """
    props = CommitProperties(custom_metadata={OPERATION_KEY: operation})

    def attempt() -> int:
        dt = store.table.dt
        dt.update_incremental()
        current = stored_checks(dt.metadata().configuration)
        target = change(current)
        if target != current:
            dt.alter.set_table_properties(
                {CHECKS_KEY: checks_to_json(target)}, raise_if_not_exists=False, commit_properties=props
            )
            dt.update_incremental()
            now = stored_checks(dt.metadata().configuration)
            if change(now) != now:
                raise CommitFailedError("the stored checks were overwritten concurrently")
        return dt.version()

    version = _retry(attempt, f"{operation.lower()} at {store.location.url}", store.location)
    store.committed()
    return version
