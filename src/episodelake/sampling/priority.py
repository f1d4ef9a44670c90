"""``el.Prioritized(priority)``: the per-item priorities a prioritized stream or transition draw starts from.

An item is a segment of a :class:`~episodelake.segment_index.SegmentIndex`
(a transition is a segment of length 1), in shard-local id order. ``priority``
is one of:

* a number: every item starts with it;
* the key of a scalar numeric per-step field (``"reward"``, a derived per-step
  column): an item's priority is the field's value at its first transition;
* any other string: a SQL expression over the ``episodes`` view (a numeric
  meta column such as ``"difficulty"``, ``"abs(return)"``) or a query
  returning ``episode_id, weight``, as for ``el.Weighted``; an item's priority is
  its episode's;
* an array: one value per episode of the collection (before ``where``/``filter``,
  as for ``el.Weighted``), or else one per item.

Every value must be finite and ``>= 0``; an ArgumentError names the first
item or episode that is not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ArgumentError
from ..read.batching import reader_for
from ..read.collection import EpisodeCollection
from ..read.selection import episode_weights
from ..read.snapshot import Snapshot
from .options import Prioritized
from .samplers import PrioritizedSampler, check_priorities
from .segment_index import SegmentIndex


def item_priorities(
    collection: EpisodeCollection, snap: Snapshot, positions: np.ndarray, index: SegmentIndex, priority: Any
) -> np.ndarray:
    """One priority per shard-local item of ``index`` (see module docstring)."""
    if isinstance(priority, bool):
        raise ArgumentError("priority must be a number, a field or SQL string, or an array, got a bool")
    if isinstance(priority, int | float | np.integer | np.floating):
        return check_priorities(np.full(len(index), float(priority)), "item")
    if isinstance(priority, str):
        field = next((f for f in snap.schema.step_fields if f.key == priority), None)
        if field is not None:
            return _step_priorities(snap, index, field)
        per_episode = episode_weights(collection, snap, positions, priority)
        return np.repeat(check_priorities(per_episode, "episode"), index.shard_counts)
    try:
        values = np.asarray(priority, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"priority must be a number, a field or SQL string, or an array: {exc}") from None
    if values.shape == (len(collection.positions),):
        per_episode = episode_weights(collection, snap, positions, values)
        return np.repeat(check_priorities(per_episode, "episode"), index.shard_counts)
    if values.shape == (len(index),):
        return check_priorities(values, "item")
    raise ArgumentError(
        f"priority: expected one value per episode ({len(collection.positions)}) or per item ({len(index)}), "
        f"got shape {values.shape}"
    )


def _step_priorities(snap: Snapshot, index: SegmentIndex, field: Any) -> np.ndarray:
    if field.shape != () or np.dtype(field.np_dtype).kind not in "iuf":
        raise ArgumentError(
            f"priority: step field {field.key!r} must be a numeric scalar, it has shape {field.shape} "
            f"and dtype {field.dtype}"
        )
    k, row = index.locate(np.arange(len(index), dtype=np.int64))
    values = reader_for(snap).gather(field, index.positions[k], np.maximum(row, 0)[:, None])[:, 0]
    return check_priorities(values.astype(np.float64), "item")


def prioritized_sampler(sampler: Any, seed: Any) -> PrioritizedSampler | None:
    """The PrioritizedSampler a draw uses: a kept one given as ``sampler=``, a new one for ``el.Prioritized``, or None.

    A new sampler draws from a generator made from ``seed`` (an int, a
    sequence, a ``Generator`` or None); a kept one has its own, and its own
    ``alpha``/``beta``.
    """
    if isinstance(sampler, PrioritizedSampler):
        return sampler
    if isinstance(sampler, Prioritized):
        return PrioritizedSampler(sampler.alpha, sampler.beta, seed, priority=sampler.priority)
    return None


def bind(
    sampler: PrioritizedSampler,
    collection: EpisodeCollection,
    snap: Snapshot,
    positions: np.ndarray,
    index: SegmentIndex,
    priority: Any,
) -> None:
    """Point ``sampler`` at ``index``'s items; new items start at ``priority`` (None: the largest seen)."""
    # the episodes and counts below follow from these three (arrays are replaced, never changed, when an index
    # grows): repeated draws from one cached index skip the gather and the comparisons
    key = (snap, index.positions, index.shard_counts)
    bound = sampler.bound_key
    if bound is not None and all(a is b for a, b in zip(bound, key, strict=True)):
        return

    def initial() -> np.ndarray:
        return item_priorities(collection, snap, positions, index, priority)

    episode_ids = snap.index["episode_id"][index.positions]
    sampler.bind(episode_ids, index.shard_counts, None if priority is None else initial)
    sampler.bound_key = key
