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

What a violation does is the field's ``on_fail`` (``FieldSpec(on_fail=)``,
per field or per constraint): ``reject`` (default) raises
:class:`QualityError`; ``quarantine`` and ``warn`` are returned for the gate
to record, as a :class:`~episodelake.core.quality.Check`'s are, under the
name ``"<field key>: <constraint>"`` (``Violation.name``).

Messages print plain values (Python numbers and strings, never NumPy reprs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .checks import plain
from .episode import EpisodeBatch
from .errors import QualityError
from .schema import CONSTRAINTS, DatasetSchema, FieldSpec
from .summary import WINDOW_BYTES


@dataclass(frozen=True)
class Violation:
    """The first failure of one constraint in one episode: the episode (batch index), its step (None: meta)."""

    episode: int
    step: int | None
    field: FieldSpec
    constraint: str

    @property
    def name(self) -> str:
        """``"<field key>: <constraint>"``: ``QualityError.check`` and the entry in ``checks_failed``."""
        return f"{self.field.key}: {self.constraint}"

    @property
    def on_fail(self) -> str:
        """What the violation does: ``reject``, ``quarantine`` or ``warn`` (the field's ``on_fail``)."""
        return self.field.on_fail_of(self.constraint)

    def describe(self) -> str:
        value = plain(getattr(self.field, self.constraint))
        at = "" if self.step is None else f" at step {self.step}"
        return f"field {self.field.key!r} fails {self.constraint}={value!r}{at}"


def constrained(schema: DatasetSchema) -> list[FieldSpec]:
    """The fields of ``schema`` with at least one constraint."""
    return [f for f in schema.fields if any(getattr(f, k) is not None for k in CONSTRAINTS)]


def violations(schema: DatasetSchema, batch: EpisodeBatch) -> list[Violation]:
    """Every (episode, field, constraint) of ``batch`` that fails, each with its first failing step.

    Ordered by field (schema order), then constraint (:data:`CONSTRAINTS`
    order), then episode. One NumPy pass per field and constraint; Python
    objects only for the failures.
    """
    found: list[Violation] = []
    for f in constrained(schema):
        if f.role == "meta":
            values, valid = batch.meta[f.name]
            rows = np.asarray(values).reshape(len(batch), -1)
            for bound in ("min", "max"):
                if getattr(f, bound) is None:
                    continue
                bad = _out_of_bounds(f, bound, rows) & valid
                found += [Violation(e, None, f, bound) for e in np.flatnonzero(bad).tolist()]
            continue
        rows = batch.data[f.key].reshape(len(batch.data[f.key]), -1)
        starts = batch.row_starts(f)
        for constraint in CONSTRAINTS:
            if getattr(f, constraint) is None:
                continue
            bad_rows = np.flatnonzero(_CHECKS[constraint](f, rows, starts))
            if not bad_rows.size:
                continue
            episodes = np.searchsorted(starts, bad_rows, side="right") - 1
            failing, first = np.unique(episodes, return_index=True)  # each episode's first failing row
            steps = bad_rows[first] - starts[failing]
            found += [Violation(e, s, f, constraint) for e, s in zip(failing.tolist(), steps.tolist(), strict=True)]
    return found


def check_constraints(schema: DatasetSchema, batch: EpisodeBatch, label: Callable[[int], str]) -> list[Violation]:
    """The ``quarantine``/``warn`` violations of ``batch``, or :class:`QualityError` for its first rejecting one.

    ``label(i)`` names episode ``i`` in the error. The first rejection is the
    one in the lowest-numbered episode (ties: schema order, then constraint
    order); a batch with one raises and returns nothing.
    """
    found = violations(schema, batch)
    rejected = [v for v in found if v.on_fail == "reject"]
    if rejected:
        v = min(rejected, key=lambda v: v.episode)
        raise QualityError(
            f"{label(v.episode)}: {v.describe()}; the episode was rejected and nothing of it was stored",
            check=v.name,
            episode=v.episode,
            step=v.step,
        )
    return found


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
