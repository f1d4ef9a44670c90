"""Audits of stored episodes against quality checks: :func:`audit` and its :class:`CheckReport`.

An audit runs :func:`~episodelake.core.quality.failures_sql` (the same SQL a
commit evaluates) sandboxed over one collection's ``episodes`` and ``steps``
views at its pinned version: a whole dataset, or a view (``where``). Each
check is bound on its own first, so a predicate naming a column the views
lack is a :class:`QueryError` naming that check, and nothing runs. The audit
reads what SQL reads (per-step lists for step-level checks, never tensors)
and writes nothing. :func:`merged` joins the reports of disjoint episode
sets (a dataset's episodes and its quarantined ones) into one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ArgumentError, ValidationError
from ..core.quality import FAILURE_COLUMNS, Check, check_list, failures_sql
from .collection import EpisodeCollection, subset
from .query import SnapshotViews, SQLResult, Views, answer
from .snapshot import Snapshot

SHOWN = 5  # failing episodes a printed report lists per check


@dataclass(frozen=True)
class CheckResult:
    """One check's failures: ``episode_ids`` in id order; ``steps``, the first failing step of each (step level)."""

    check: Check
    episode_ids: np.ndarray
    steps: np.ndarray | None  # None for an episode-level check

    @property
    def failed(self) -> int:
        """How many episodes failed the check."""
        return len(self.episode_ids)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.check.to_dict(),
            "failed": self.failed,
            "episode_ids": self.episode_ids.tolist(),
            "steps": None if self.steps is None else self.steps.tolist(),
        }


@dataclass(frozen=True)
class CheckReport:
    """Outcome of an audit of ``episodes`` episodes at ``version`` of ``url``: one :class:`CheckResult` per check.

    ``ok`` is True when no episode failed any check. ``report[name]`` is a
    check's result; ``str(report)`` a table; :meth:`to_arrow` the failures.
    """

    url: str
    version: int
    episodes: int
    results: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.failed == 0 for r in self.results)

    @property
    def failed(self) -> list[str]:
        """Names of the checks some episode failed, in the checks' order."""
        return [r.check.name for r in self.results if r.failed]

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.check.name == name:
                return r
        raise KeyError(f"no check named {name!r} in this report (checks: {[r.check.name for r in self.results]})")

    def __iter__(self) -> Iterator[CheckResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def to_arrow(self) -> pa.Table:
        """Every failure, one row per (check, episode): ``check``, ``episode_id``, ``step`` (NULL: episode level)."""
        names: list[str] = []
        ids: list[np.ndarray] = []
        steps: list[int | None] = []
        for r in self.results:
            names += [r.check.name] * r.failed
            ids.append(r.episode_ids)
            steps += [None] * r.failed if r.steps is None else r.steps.tolist()
        all_ids = np.concatenate([np.zeros(0, np.int64), *ids])
        columns = [pa.array(names, pa.string()), pa.array(all_ids, pa.int64()), pa.array(steps, pa.int64())]
        return pa.table(dict(zip(FAILURE_COLUMNS, columns, strict=True)))

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "version": self.version,
            "episodes": self.episodes,
            "ok": self.ok,
            "checks": [r.to_json() for r in self.results],
        }

    def raise_if_failed(self) -> None:
        """Raise :class:`ValidationError` naming each failed check and its first failing episodes, if any failed."""
        if not self.ok:
            raise ValidationError(f"{self.url} version {self.version}: checks failed\n{self}")

    def __str__(self) -> str:
        head = ("check", "level", "on_fail", "failed", "first failing episodes (step)")
        rows = [head]
        for r in self.results:
            ids = r.episode_ids[:SHOWN].tolist()
            if r.steps is None:
                shown = [str(i) for i in ids]
            else:
                shown = [f"{i} (t={t})" for i, t in zip(ids, r.steps[:SHOWN].tolist(), strict=True)]
            more = f", ... {r.failed - SHOWN} more" if r.failed > SHOWN else ""
            count = f"{r.failed}/{self.episodes}"
            rows.append((r.check.name, r.check.level, r.check.on_fail, count, ", ".join(shown) + more))
        widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
        lines = [
            "  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]).rstrip() for row in rows
        ]
        verdict = "ok" if self.ok else f"{len(self.failed)} check(s) failed"
        return f"{self.url} version {self.version}: {self.episodes} episodes, {verdict}\n" + "\n".join(lines)

    def __repr__(self) -> str:
        head = json.dumps({k: v for k, v in self.to_json().items() if k != "checks"})
        return f"CheckReport({head}, failed={self.failed})"


def merged(reports: Iterable[CheckReport]) -> CheckReport:
    """One report of audits of disjoint episode sets of one version with the same checks (ids in id order)."""
    parts = list(reports)
    results = []
    for i, first in enumerate(parts[0].results):
        mine = [p.results[i] for p in parts]
        ids = np.concatenate([r.episode_ids for r in mine])
        order = np.argsort(ids, kind="stable")
        steps = None if first.steps is None else np.concatenate([r.steps for r in mine if r.steps is not None])[order]
        results.append(CheckResult(first.check, ids[order], steps))
    return CheckReport(parts[0].url, parts[0].version, sum(p.episodes for p in parts), tuple(results))


def bind(views: Views, checks: Iterable[Check]) -> None:
    """Bind each check's SQL over ``views`` (nothing runs): :class:`QueryError` naming the first that does not bind."""
    for c in check_list(checks):
        SQLResult(views, failures_sql([c]), None, True, f"Check {c.name!r}: predicate {c.predicate!r} over {c.view}")


def audit(collection: EpisodeCollection, checks: Iterable[Check] | None = None) -> CheckReport:
    """Run ``checks`` (None: the checks stored with the collection's version) over its episodes; the report.

    An empty list of checks (or none stored) is an :class:`ArgumentError`: an
    audit of nothing would read as a pass.
    """

    def body(snap: Snapshot) -> CheckReport:
        chosen = snap.checks if checks is None else check_list(checks)
        if not chosen:
            stored = "no checks are stored with this version" if checks is None else "checks= is empty"
            raise ArgumentError(f"check: nothing to check ({stored}); add checks or pass checks=")
        views = SnapshotViews(collection, snap)
        bind(views, chosen)
        what = f"auditing {[c.name for c in chosen]}"
        found = SQLResult(views, failures_sql(chosen), None, True, what).to_arrow_table()
        names = np.asarray(found.column("check").to_pylist(), dtype=object)
        ids = found.column("episode_id").to_numpy()
        steps = found.column("step").to_numpy(zero_copy_only=False)
        results = []
        for c in chosen:
            mine = names == c.name
            step = None if c.level == "episode" else steps[mine].astype(np.int64)
            results.append(CheckResult(c, ids[mine].astype(np.int64), step))
        within = subset(collection, snap)
        if within is None:  # counted by SQL from the Parquet metadata, not the snapshot's index scan
            count = SQLResult(views, "SELECT count(*) FROM episodes", None, True, what).fetchall()
            episodes = int(count[0][0])
        else:
            episodes = len(within)
        return CheckReport(snap.loc.url, snap.version, episodes, tuple(results))

    return answer(collection, body)
