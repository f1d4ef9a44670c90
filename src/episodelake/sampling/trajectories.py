"""Whole episodes as NumPy: all of them at once (``to_numpy``), or sampled batches padded to the longest.

A *trajectory batch* holds ``B`` whole episodes, time-padded to the longest
one in the batch, ``Lmax`` transitions: a :class:`TrajectoryBatch` (a
:class:`~episodelake.batch.SegmentBatch` with ``start == 0``) whose
observation fields hold ``[B, Lmax + 1, ...]`` rows (the T+1 rule: episode
``b``'s observations are rows ``[0, T_b + 1)``, so ``obs``/``next_obs`` stay
aligned), other step fields ``[B, Lmax, ...]``, ``mask`` ``[B, Lmax]`` (True
on the episode's ``T_b`` transitions) and ``lengths`` ``[B]``. Rows past an
episode's end hold ``pad_value`` (zeros by default).

:class:`TrajectoryStream` draws them from one or more *sources* (a snapshot
and the positions of its episodes): with replacement (infinite; a source is
picked with probability ``probs[s]``, then one of its episodes uniformly), or
in one ordered or shuffled pass over every episode of every source in order.
Its state (``state_dict``) resumes it exactly.

:func:`to_numpy` gives every episode of a source: rows concatenated with
offsets, or padded to the longest episode like a trajectory batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from ..core.episode import rows_for
from ..core.errors import ArgumentError
from ..core.schema import DatasetSchema
from ..core.segments import Segment
from ..read.batching import reader_for
from ..read.snapshot import Snapshot
from .batch import SegmentBatch
from .options import Strategy, kind_of, sampler_of
from .segment_index import check_positive, check_seed

# the stream's mode for each kind of sampler= it takes
MODES = {"uniform": "random", "passes": "permutation", "sequential": "ordered"}
Source = tuple[Snapshot, np.ndarray]  # a snapshot and positions of its episodes, in episode order
STATE_FORMAT = 1


class TrajectoryBatch(SegmentBatch):
    """Whole episodes padded to the longest (see module docstring); ``source[b]``: the episode's source index."""

    lengths: np.ndarray
    source: np.ndarray


def check_pad_value(schema: DatasetSchema, pad_value: Any) -> Any:
    """``pad_value`` if it is a number every step field's dtype holds exactly, else ArgumentError naming the field."""
    if not isinstance(pad_value, int | float | bool | np.number | np.bool_):
        raise ArgumentError(f"pad_value must be a number, got {pad_value!r}")
    for f in schema.step_fields:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                held = np.array(pad_value).astype(f.np_dtype)
            except (OverflowError, ValueError):
                held = None
        if held is None or not (held == pad_value or (np.isnan(pad_value) and np.isnan(held))):
            raise ArgumentError(f"pad_value {pad_value!r} does not fit field {f.key!r} ({f.np_dtype})")
    return pad_value


def join_items(parts: Sequence[Segment], order: np.ndarray) -> Segment:
    """Batches of one schema (same time length) joined along the batch axis, then items ``order`` taken."""
    if len(parts) == 1 and np.array_equal(order, np.arange(len(order))):
        return parts[0]

    def cat(values: list[Any]) -> np.ndarray:
        return np.concatenate(values)[order]

    first = parts[0]
    return Segment(
        first.schema,
        {k: cat([p.data[k] for p in parts]) for k in first.data},
        cat([p.terminated for p in parts]),
        cat([p.truncated for p in parts]),
        cat([p.mask for p in parts]),
        {k: cat([p.meta.flat()[k] for p in parts]) for k in first.meta.flat()},
        cat([p.episode_id for p in parts]),
        cat([p.start for p in parts]),
        time_axis=1,
        meta_mask={k: cat([p.meta_mask.flat()[k] for p in parts]) for k in first.meta_mask.flat()},
    )


def read_padded(sources: Sequence[Source], which: np.ndarray, pos: np.ndarray, pad_value: Any = 0) -> TrajectoryBatch:
    """Episodes ``pos[b]`` of sources ``which[b]``, whole, padded to the longest of them."""
    lengths = np.array([sources[s][0].lengths[p] for s, p in zip(which.tolist(), pos.tolist(), strict=True)])
    longest = int(lengths.max()) if len(lengths) else 0
    parts, items = [], []
    for s in np.unique(which).tolist():
        hit = np.flatnonzero(which == s)
        parts.append(reader_for(sources[s][0]).segments(pos[hit], np.zeros(len(hit), np.int64), longest))
        items.append(hit)
    order = np.argsort(np.concatenate(items), kind="stable")
    batch = cast(TrajectoryBatch, TrajectoryBatch.wrap(join_items(parts, order)))
    if pad_value != 0:
        batch.data = dict(batch.data)
        for f in batch.schema.step_fields:
            arr = batch.data[f.key] = np.array(batch.data[f.key])
            arr[np.arange(arr.shape[1])[None, :] >= rows_for(f, lengths)[:, None]] = pad_value
    batch.lengths = lengths.astype(np.int64)
    batch.source = which.astype(np.int64)
    return batch


def to_numpy(snap: Snapshot, positions: np.ndarray, pad: bool = False, length: int | None = None) -> dict[str, Any]:
    """Every step field's rows of episodes ``positions`` (episode order) plus per-episode arrays.

    Always: ``episode_id``, ``length``, ``terminated``, ``truncated`` ``[N]``,
    ``meta/<name>`` ``[N, ...]`` (typed; unset values hold the fill value)
    and ``meta_mask/<name>`` ``[N]``. ``pad=False``: each step field ``<key>``
    is all episodes' rows concatenated, episode ``i``'s transitions are rows
    ``offsets[i]:offsets[i + 1]`` of non-observation fields and its ``T + 1``
    observations rows ``obs_offsets[i]:obs_offsets[i + 1]``. ``pad=True``:
    fields are ``[N, Lmax(+1), ...]`` padded with zeros as a trajectory batch
    (``Lmax``: ``length`` or the longest episode) and ``mask`` ``[N, Lmax]``.
    """
    positions = np.asarray(positions, dtype=np.int64)
    lengths = snap.lengths[positions]
    reader = reader_for(snap)
    out: dict[str, Any] = {
        "episode_id": reader.episode_ids[positions],
        "length": lengths.astype(np.int64),
        "terminated": reader.terminated[positions],
        "truncated": reader.truncated[positions],
    }
    if pad:
        longest = int(lengths.max(initial=0)) if length is None else length
        seg = reader.segments(positions, np.zeros(len(positions), np.int64), longest)
        out.update({k: np.array(v) for k, v in seg.data.items()}, mask=seg.mask)
    else:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out.update(offsets=offsets, obs_offsets=offsets + np.arange(len(offsets)))
        for f in snap.schema.step_fields:
            n = rows_for(f, lengths)
            rows = snap.read_ranges(f, positions.tolist(), [0] * len(positions), n.tolist())
            out[f.key] = np.concatenate(rows) if rows else np.empty((0, *f.shape), f.np_dtype)
    for name, values in reader.meta.items():
        out[f"meta/{name}"] = values[positions]
        out[f"meta_mask/{name}"] = reader.meta_valid[name][positions]
    return out


def fresh_seed() -> int:
    """A random seed from OS entropy, kept so that a stream made without one still saves a resumable state."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))


def check_probs(probs: Any, sizes: Sequence[int]) -> np.ndarray:
    """Source probabilities: ``probs`` (one non-negative finite weight per source) or by size; normalized."""
    if probs is None:
        w = np.asarray(sizes, dtype=np.float64)
    else:
        w = np.asarray(probs, dtype=np.float64)
        if w.shape != (len(sizes),):
            raise ArgumentError(f"weights: expected one weight per source ({len(sizes)}), got shape {w.shape}")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ArgumentError(f"weights must be finite and >= 0, got {w.tolist()}")
        empty = [s for s in range(len(sizes)) if w[s] > 0 and sizes[s] == 0]
        if empty:
            raise ArgumentError(f"source {empty[0]} has weight {w[empty[0]]} but nothing to sample")
    if w.sum() <= 0:
        raise ArgumentError("nothing to sample: every source is empty or has weight 0")
    return w / w.sum()


class TrajectoryStream:
    """Batches of whole episodes padded to the longest (:class:`TrajectoryBatch`); see module docstring.

    ``sampler``: ``el.Uniform()`` (None, the default): infinite, with
    replacement. ``el.Uniform(replacement=False)``: one pass over every episode
    in a permutation seeded by ``(seed, epoch)``; ``el.Sequential()``: one pass
    in order. A finite stream raises StopIteration at the end of a pass;
    iterating it again runs the next pass. ``drop_last`` drops a pass's short
    last batch.
    """

    def __init__(
        self,
        schema: DatasetSchema,
        sources: Sequence[Source],
        batch_size: int,
        *,
        probs: Any = None,
        seed: int | None = None,
        sampler: Strategy | None = None,
        drop_last: bool = False,
        pad_value: Any = 0,
    ) -> None:
        self.schema = schema
        self.sources = list(sources)
        self.batch_size = check_positive(batch_size, "batch_size")
        self.pad_value = check_pad_value(schema, pad_value)
        sizes = [len(p) for _, p in self.sources]
        self.probs = check_probs(probs, sizes)
        self.mode = MODES[kind_of(sampler_of(sampler, "trajectories", tuple(MODES)))]
        if self.mode != "random" and probs is not None:
            raise ArgumentError("weights apply to sampling with replacement; a pass visits every episode once")
        seed = check_seed(seed)
        self.seed = fresh_seed() if seed is None else seed
        self.drop_last = bool(drop_last)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._unit_source = np.repeat(np.arange(len(sizes)), sizes)
        self._unit_index = np.concatenate([np.arange(n) for n in sizes]) if sizes else np.zeros(0, np.int64)
        self._rng = np.random.default_rng(self.seed)
        self.epoch, self.consumed, self._ended = 0, 0, False

    @property
    def total(self) -> int:
        """Episodes in all sources."""
        return int(self._sizes.sum())

    def __len__(self) -> int:
        """Batches in one pass (finite streams only)."""
        if self.mode == "random":
            raise TypeError("an infinite trajectory stream (with replacement) has no len()")
        full, rest = divmod(self.total, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _next_units(self) -> np.ndarray | None:
        if self.mode == "random":
            u = self._rng.random(self.batch_size)
            which = np.searchsorted(np.cumsum(self.probs), u, side="right")
            which = np.minimum(which, len(self.probs) - 1)
            offsets = np.concatenate([[0], np.cumsum(self._sizes)])
            return offsets[which] + self._rng.integers(0, self._sizes[which])
        left = self.total - self.consumed
        b = min(self.batch_size, left)
        if self._ended or b == 0 or (self.drop_last and b < self.batch_size):
            self._ended = True
            return None
        units = np.arange(self.consumed, self.consumed + b)
        self.consumed += b
        if self.mode == "permutation":
            units = np.random.default_rng([self.seed, self.epoch]).permutation(self.total)[units]
        return units

    def __iter__(self) -> Iterator[TrajectoryBatch]:
        if self._ended:
            self.epoch, self.consumed, self._ended = self.epoch + 1, 0, False
        return self

    def __next__(self) -> TrajectoryBatch:
        units = self._next_units()
        if units is None:
            raise StopIteration
        return read_padded(self.sources, self._unit_source[units], self._unit_index_to_pos(units), self.pad_value)

    def _unit_index_to_pos(self, units: np.ndarray) -> np.ndarray:
        which = self._unit_source[units]
        out = np.empty(len(units), dtype=np.int64)
        for s in np.unique(which).tolist():
            hit = which == s
            out[hit] = self.sources[s][1][self._unit_index[units[hit]]]
        return out

    def sample(self) -> TrajectoryBatch:
        """The next batch (:class:`StopIteration` at the end of a finite pass)."""
        return next(self)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch returned, as plain values."""
        return {
            "format": STATE_FORMAT,
            "mode": self.mode,
            "seed": self.seed,
            "sizes": self._sizes.tolist(),
            "batch_size": self.batch_size,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "ended": self._ended,
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; a state of a different stream raises ArgumentError naming what differs."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: not a trajectory stream state (format {STATE_FORMAT})")
        for key, mine in (("mode", self.mode), ("sizes", self._sizes.tolist()), ("batch_size", self.batch_size)):
            if state.get(key) != mine:
                raise ArgumentError(f"state_dict: {key} is {state.get(key)!r} in the saved state but {mine!r} here")
        self.seed = int(state["seed"])
        self._rng = np.random.default_rng(self.seed)
        self._rng.bit_generator.state = state["rng"]
        self.epoch, self.consumed, self._ended = int(state["epoch"]), int(state["consumed"]), bool(state["ended"])

    def __repr__(self) -> str:
        return f"TrajectoryStream({self.total} episodes, batch_size={self.batch_size}, mode={self.mode})"
