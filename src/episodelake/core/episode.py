"""The finished-episode value type and the one rule for how many rows a field holds.

An episode of ``T`` transitions holds ``T + 1`` rows of every observation field
(the first observation, then the one each action produced) and ``T`` rows of
every other per-step field. :func:`rows_for` is that rule; every reader,
writer, copy and audit asks it instead of re-deriving it.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np

from .schema import DatasetSchema, FieldSpec

Rows = TypeVar("Rows", int, np.ndarray)


def python_meta(value: Any) -> Any:
    """A meta value as Python code takes it: a NumPy scalar (or 0-d array) becomes the Python scalar
    (``int``, ``float``, ``bool``, ``complex``, ``str``); None, ``str`` and shaped values (arrays in the
    field's dtype) stay as they are.

    Why: ``env.reset(seed=meta["seed"])`` and JSON need Python scalars, not ``np.uint64``.
    """
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    return value


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


@dataclass
class EpisodeBatch:
    """Validated episodes in columnar form: what one commit writes.

    ``data[key]`` holds every episode's rows of that field, episode after
    episode (``rows_for(field, lengths)`` rows each); ``meta[name]`` is
    ``(values, valid)``: one value per episode and a mask (False: NULL).
    ``failed``: per episode, the names of the quarantine and warn checks it
    failed at its commit-time gate, and whether one was a quarantine check
    (None: no episode failed one).
    Sub-batches (:meth:`take`) are views, not copies.
    """

    data: dict[str, np.ndarray]
    lengths: np.ndarray  # int64 [n]
    terminated: np.ndarray  # bool [n]
    truncated: np.ndarray  # bool [n]
    meta: dict[str, tuple[np.ndarray, np.ndarray]]
    created_at: np.ndarray  # datetime64[us] [n], UTC
    failed: tuple[tuple[tuple[str, ...], bool], ...] | None = None  # per episode: (failed checks, quarantined)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values())

    def row_starts(self, f: FieldSpec) -> np.ndarray:
        """Each episode's first row in ``data[f.key]`` (int64 [n + 1]: the last entry is the total)."""
        starts = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(rows_for(f, self.lengths), out=starts[1:])
        return starts

    def take(self, fields: Sequence[FieldSpec], a: int, b: int) -> EpisodeBatch:
        """Episodes ``[a, b)`` (views of this batch's arrays)."""
        data = {}
        for f in fields:
            starts = self.row_starts(f)
            data[f.key] = self.data[f.key][starts[a] : starts[b]]
        return EpisodeBatch(
            data,
            self.lengths[a:b],
            self.terminated[a:b],
            self.truncated[a:b],
            {k: (v[a:b], ok[a:b]) for k, (v, ok) in self.meta.items()},
            self.created_at[a:b],
            None if self.failed is None else self.failed[a:b],
        )


_MAPPED_BYTES = 1 << 22


def concat_rows(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)`` into a new block; a large block is anonymous mapped memory.

    Why: a fresh ``malloc`` block of hundreds of MiB is faulted in 4 KiB pages
    (measured 5x slower to fill on the reference machine), an anonymous
    mapping is eligible for transparent huge pages.
    """
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    rows = sum(map(len, parts))  # map: no generator frame per part (a dict import's groups hold thousands)
    dtype = np.result_type(*parts)
    nbytes = rows * int(np.prod(first.shape[1:], dtype=np.int64)) * dtype.itemsize
    if nbytes < _MAPPED_BYTES:
        return np.concatenate(parts)
    out = np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(rows, *first.shape[1:])
    return np.concatenate(parts, out=out)


def batch_of(schema: DatasetSchema, episodes: Sequence[FinishedEpisode]) -> EpisodeBatch:
    """Finished episodes gathered into one batch (each field's rows copied once, contiguous)."""
    meta = {}
    for f in schema.meta_fields:
        raw = [e.meta.get(f.name) for e in episodes]
        valid = np.array([v is not None for v in raw], dtype=bool)
        if f.np_dtype.kind == "U":
            values = np.array(["" if v is None else v for v in raw], dtype=object)
        else:
            values = np.zeros((len(raw), *f.shape), f.np_dtype)
            for i, v in enumerate(raw):
                if v is not None:
                    values[i] = v
        meta[f.name] = (values, valid)
    return EpisodeBatch(
        {f.key: concat_rows([e.data[f.key] for e in episodes]) for f in schema.step_fields},
        np.array([e.length for e in episodes], dtype=np.int64),
        np.array([e.terminated for e in episodes], dtype=bool),
        np.array([e.truncated for e in episodes], dtype=bool),
        meta,
        np.array([np.datetime64(e.created_at.replace(tzinfo=None), "us") for e in episodes]),
    )


def concat_batches(schema: DatasetSchema, batches: Sequence[EpisodeBatch]) -> EpisodeBatch:
    """One batch holding ``batches``' episodes in order (a single batch is returned as is)."""
    if len(batches) == 1:
        return batches[0]
    return EpisodeBatch(
        {f.key: concat_rows([b.data[f.key] for b in batches]) for f in schema.step_fields},
        np.concatenate([b.lengths for b in batches]),
        np.concatenate([b.terminated for b in batches]),
        np.concatenate([b.truncated for b in batches]),
        {
            f.name: (
                np.concatenate([b.meta[f.name][0] for b in batches]),
                np.concatenate([b.meta[f.name][1] for b in batches]),
            )
            for f in schema.meta_fields
        },
        np.concatenate([b.created_at for b in batches]),
        None
        if all(b.failed is None for b in batches)
        else tuple(item for b in batches for item in (b.failed or (((), False),) * len(b))),
    )
