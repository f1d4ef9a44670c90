"""``FieldSpec`` quality constraints (``min``, ``max``, ``monotonic``, ``max_repeat``) over a whole batch at once.

Vectorized over episodes: per field and constraint, one NumPy pass over the
batch's rows flags the failing rows, and ``searchsorted`` over the episodes'
row starts names the episode and its step. The values are the in-memory
rows a writer hands over (no stored data is read). Rules:

* ``min``/``max``: every element ``>= min`` / ``<= max``; NaN fails
  (``NaN >= min`` is false). Meta fields: per episode, NULL passes.
* ``monotonic="increasing"``: every element of row ``t`` greater than
  row ``t - 1``'s within the episode; ``"nondecreasing"``: greater or equal.
* ``max_repeat=k``: no run of more than ``k`` consecutive rows identical
  bit for bit within the episode; the failing step is the run's
  ``(k + 1)``-th row.

A constraint rejects: there is no ``on_fail`` on a constraint (a SQL
:class:`~episodelake.core.quality.Check` quarantines or warns instead).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .episode import EpisodeBatch
from .errors import QualityError
from .schema import CONSTRAINTS, DatasetSchema, FieldSpec
from .summary import WINDOW_BYTES


@dataclass(frozen=True)
class Violation:
    """The first failure of one constraint in a batch: the episode (batch index), its step (None: meta)."""

    episode: int
    step: int | None
    field: FieldSpec
    constraint: str

    def describe(self) -> str:
        value = getattr(self.field, self.constraint)
        at = "" if self.step is None else f" at step {self.step}"
        return f"field {self.field.key!r} fails {self.constraint}={value!r}{at}"


def constrained(schema: DatasetSchema) -> list[FieldSpec]:
    """The fields of ``schema`` with at least one constraint."""
    return [f for f in schema.fields if any(getattr(f, k) is not None for k in CONSTRAINTS)]


def first_violation(schema: DatasetSchema, batch: EpisodeBatch) -> Violation | None:
    """The violation in the lowest-numbered episode of ``batch`` (ties: schema order, then constraint order)."""
    found: list[Violation] = []
    for f in constrained(schema):
        if f.role == "meta":
            values, valid = batch.meta[f.name]
            rows = np.asarray(values).reshape(len(batch), -1)
            for bound in ("min", "max"):
                bad = _out_of_bounds(f, bound, rows) & valid
                if bad.any():
                    found.append(Violation(int(np.argmax(bad)), None, f, bound))
            continue
        rows = batch.data[f.key].reshape(len(batch.data[f.key]), -1)
        starts = batch.row_starts(f)
        for constraint in CONSTRAINTS:
            if getattr(f, constraint) is None:
                continue
            bad_rows = _CHECKS[constraint](f, rows, starts)
            if bad_rows.any():
                r = int(np.argmax(bad_rows))
                e = int(np.searchsorted(starts, r, side="right")) - 1
                found.append(Violation(e, r - int(starts[e]), f, constraint))
    return min(found, key=lambda v: v.episode) if found else None


def check_constraints(schema: DatasetSchema, batch: EpisodeBatch, label: Callable[[int], str]) -> None:
    """Raise :class:`QualityError` for the first violation in ``batch`` (``label(i)`` names episode ``i``)."""
    v = first_violation(schema, batch)
    if v is not None:
        raise QualityError(
            f"{label(v.episode)}: {v.describe()}; the episode was rejected and nothing of it was stored",
            check=f"{v.field.key}: {v.constraint}",
            episode=v.episode,
            step=v.step,
        )


@np.errstate(invalid="ignore")
def _out_of_bounds(f: FieldSpec, bound: str, rows: np.ndarray) -> np.ndarray:
    """Per row: whether some element fails ``f``'s ``bound`` (``min`` or ``max``)."""
    limit = getattr(f, bound)
    ok = rows >= limit if bound == "min" else rows <= limit
    return ~ok.all(axis=1)


def _bounds(bound: str) -> Callable[[FieldSpec, np.ndarray, np.ndarray], np.ndarray]:
    return lambda f, rows, starts: _out_of_bounds(f, bound, rows)


def _within(starts: np.ndarray, rows: int) -> np.ndarray:
    """Per row: whether it follows a row of the same episode (False at each episode's first row)."""
    follows = np.ones(rows, dtype=bool)
    follows[starts[:-1]] = False  # every episode has rows: each start is a row
    return follows


@np.errstate(invalid="ignore")
def _not_monotonic(f: FieldSpec, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    bad = np.zeros(len(rows), dtype=bool)
    step = rows[1:] > rows[:-1] if f.monotonic == "increasing" else rows[1:] >= rows[:-1]
    bad[1:] = ~step.all(axis=1)
    return bad & _within(starts, len(rows))


def _repeated(f: FieldSpec, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Rows that are the ``(max_repeat + 1)``-th (or later) identical row of a run within their episode."""
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), -1)
    if raw.shape[1] % 8 == 0:  # compared 8 bytes at a time
        raw = raw.view(np.uint64)
    same = np.zeros(len(rows), dtype=np.int64)
    window = max(1, WINDOW_BYTES // max(1, raw[:1].nbytes))  # the comparison's temporary stays cache-sized
    for r in range(1, len(rows), window):
        hi = min(r + window, len(rows))
        same[r:hi] = (raw[r:hi] == raw[r - 1 : hi - 1]).all(axis=1)
    same &= _within(starts, len(rows))
    total = np.cumsum(same)
    # the run of identical rows ending at each row: repeats since the last row that differed
    run = total - np.maximum.accumulate(np.where(same == 0, total, 0))
    assert f.max_repeat is not None
    return run >= f.max_repeat


_CHECKS: dict[str, Callable[[FieldSpec, np.ndarray, np.ndarray], np.ndarray]] = {
    "min": _bounds("min"),
    "max": _bounds("max"),
    "monotonic": _not_monotonic,
    "max_repeat": _repeated,
}
