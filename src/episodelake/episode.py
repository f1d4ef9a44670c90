"""The finished-episode value type and the one rule for how many rows a field holds.

An episode of ``T`` transitions holds ``T + 1`` rows of every observation field
(the first observation, then the one each action produced) and ``T`` rows of
every other per-step field. :func:`rows_for` is that rule; every reader,
writer, copy and audit asks it instead of re-deriving it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np

from .schema import FieldSpec

Rows = TypeVar("Rows", int, np.ndarray)


def extra_rows(f: FieldSpec) -> int:
    """Rows ``f`` holds beyond the episode's transitions: 1 for an observation field, else 0."""
    return 1 if f.role == "observation" else 0


def rows_for(f: FieldSpec, length: Rows) -> Rows:
    """Rows of ``f`` in an episode of ``length`` transitions (an int, or an array of lengths)."""
    return length + extra_rows(f)


@dataclass
class FinishedEpisode:
    """A validated episode ready to commit: ``data[key]`` has ``rows_for(field, length)`` rows."""

    data: dict[str, np.ndarray]
    length: int
    terminated: bool
    truncated: bool
    meta: dict[str, Any]
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values())
