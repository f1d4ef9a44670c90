"""Quality checks: ``Check``, its stored form, and the one SQL that finds the episodes failing a set of checks.

A :class:`Check` is a named SQL predicate that every episode must satisfy:

* ``level="episode"``: over the episode's row in the ``episodes`` view
  (``'NOT success OR "return" > 0'``);
* ``level="step"``: over each of its rows in the ``steps`` view
  (``'abs("action"[1]) <= 1'``); the episode fails when any step does.

**A NULL result fails.** SQL ``CHECK`` constraints pass a NULL, but here a
NULL means a value the predicate could not judge (a missing ``return``, a
derived column never set, NULL arithmetic), and letting an unjudged episode
through is the silent failure checks exist to catch: an episode passes only
where its predicate is TRUE. (DuckDB orders NaN above every number, so
``x <= 1`` is FALSE for NaN and ``x >= 0`` TRUE: write ``isfinite(x)`` when
NaN must fail.)

``on_fail`` says what a commit does with a failing episode (``reject``,
``quarantine``, ``warn``); audits report every failure whatever it says.

Checks are stored with the dataset in the episode table's property
:data:`CHECKS_KEY` (a JSON list of :meth:`Check.to_dict`), so every table
version carries the checks of that version and time travel sees them.
:func:`failures_sql` is the one place that turns checks into SQL: commit-time
evaluation and audits both run it over views named ``episodes`` and ``steps``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb

from .errors import ArgumentError, QueryError
from .schema import ON_FAIL

CHECKS_KEY = "episodelake.checks"  # the episode table property holding the stored checks
LEVELS = ("episode", "step")
FAILURE_COLUMNS = ("check", "episode_id", "step")  # the columns failures_sql returns, in order
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Check:
    """A named SQL predicate every episode must satisfy (see the module docstring), validated when made.

    ``name``: a simple identifier (letters, digits, ``_``; not starting with a
    digit), unique among a dataset's checks. ``predicate``: exactly one SQL
    expression without placeholders (a stored check has no values to bind),
    else :class:`QueryError` naming the check; its columns are bound against a
    dataset's views when the check is stored or run. ``level``: ``"episode"``
    or ``"step"``. ``on_fail``: ``"reject"``, ``"quarantine"`` or ``"warn"``.
    Bad names, levels and on_fail values are :class:`ArgumentError`.
    """

    name: str
    predicate: str
    level: str = "episode"
    on_fail: str = "reject"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ArgumentError(
                f"Check name must be a simple identifier (letters, digits and _, not starting with a digit), "
                f"got {self.name!r}"
            )
        if self.level not in LEVELS:
            raise ArgumentError(f"Check {self.name!r}: level must be one of {LEVELS}, got {self.level!r}")
        if self.on_fail not in ON_FAIL:
            raise ArgumentError(f"Check {self.name!r}: on_fail must be one of {ON_FAIL}, got {self.on_fail!r}")
        _expression(self.name, self.predicate)

    @property
    def view(self) -> str:
        """The view the predicate runs over: ``episodes`` or ``steps``."""
        return "episodes" if self.level == "episode" else "steps"

    def to_dict(self) -> dict[str, str]:
        """The check as JSON-ready data (:meth:`from_dict` reads it back equal)."""
        return {"name": self.name, "predicate": self.predicate, "level": self.level, "on_fail": self.on_fail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        """The check of :meth:`to_dict`'s data; unknown or missing keys are an :class:`ArgumentError`."""
        if not isinstance(data, Mapping):
            raise ArgumentError(f"a Check is read from a mapping, got {type(data).__name__}")
        unknown = set(data) - {"name", "predicate", "level", "on_fail"}
        if unknown or "name" not in data or "predicate" not in data:
            raise ArgumentError(f"a Check needs name and predicate (and optionally level, on_fail), got {sorted(data)}")
        return cls(**data)


def _expression(name: str, predicate: Any) -> None:
    """Raise QueryError naming check ``name`` unless ``predicate`` is one SQL expression without placeholders."""
    if not isinstance(predicate, str) or not predicate.strip():
        raise QueryError(f"Check {name!r} needs a SQL predicate string, got {predicate!r}")
    try:
        duckdb.SQLExpression(predicate)
        placeholders = duckdb.extract_statements(f"SELECT 1 WHERE (\n{predicate}\n)")[0].named_parameters
    except duckdb.Error as exc:
        raise QueryError(f"Check {name!r}: invalid predicate {predicate!r} (one SQL expression needed): {exc}") from exc
    if placeholders:
        raise QueryError(f"Check {name!r}: predicate {predicate!r} has placeholders; a check binds no values")


def check_list(checks: Iterable[Check]) -> tuple[Check, ...]:
    """``checks`` as a tuple, each a :class:`Check` and names unique, else :class:`ArgumentError`."""
    if isinstance(checks, Check | str | bytes | Mapping):
        raise ArgumentError(f"checks must be an iterable of Check, got {type(checks).__name__}")
    out = tuple(checks)
    for c in out:
        if not isinstance(c, Check):
            raise ArgumentError(f"checks must be Check objects, got {type(c).__name__}: {c!r}")
    names = [c.name for c in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ArgumentError(f"check names repeat: {repeated}")
    return out


def with_added(current: Iterable[Check], added: Iterable[Check]) -> tuple[Check, ...]:
    """``current`` followed by the checks of ``added`` it lacks; a name taken by a different check is an error.

    Adding a check equal to a stored one changes nothing.
    """
    have = {c.name: c for c in current}
    out = list(have.values())
    for c in check_list(added):
        if c.name not in have:
            out.append(c)
        elif have[c.name] != c:
            raise ArgumentError(f"a different check named {c.name!r} is already stored ({have[c.name]}); drop it first")
    return tuple(out)


def checks_to_json(checks: Iterable[Check]) -> str:
    """The stored form of ``checks``: the value of table property :data:`CHECKS_KEY`."""
    return json.dumps([c.to_dict() for c in checks])


def stored_checks(configuration: Mapping[str, str]) -> tuple[Check, ...]:
    """The checks recorded in a table version's properties (``configuration``); none when it has no record."""
    raw = configuration.get(CHECKS_KEY)
    return () if raw is None else tuple(Check.from_dict(d) for d in json.loads(raw))


def failures_sql(checks: Iterable[Check]) -> str:
    """One SELECT over views ``episodes`` and ``steps`` returning every (check, episode) that fails.

    Columns :data:`FAILURE_COLUMNS`: ``check`` (the name), ``episode_id`` and
    ``step``, the first failing step ``t`` of a step-level check (NULL for an
    episode-level one); one row per failing pair, ordered by the checks'
    order, then ``episode_id``. An episode fails where the predicate is not
    TRUE (FALSE or NULL). The predicates stand on lines of their own, so a
    trailing ``--`` comment cannot swallow the rest. An empty list selects
    no rows.
    """
    parts = []
    for i, c in enumerate(check_list(checks)):
        failing = f"FROM {c.view} WHERE (\n{c.predicate}\n) IS NOT TRUE"
        head = f"SELECT {i} AS k, '{c.name}' AS check_name, episode_id"
        if c.level == "episode":
            parts.append(f"{head}, NULL::BIGINT AS step {failing}")
        else:
            parts.append(f"{head}, min(t) AS step {failing}\nGROUP BY ALL")
    if not parts:
        return 'SELECT NULL::VARCHAR AS "check", NULL::BIGINT AS episode_id, NULL::BIGINT AS step WHERE false'
    union = "\nUNION ALL\n".join(parts)
    return f'SELECT check_name AS "check", episode_id, step FROM (\n{union}\n) ORDER BY k, episode_id'
