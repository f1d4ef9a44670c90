"""Segments anchored on steps: the steps an :class:`~episodelake.options.Anchors` predicate picks, and their index.

:func:`find_anchors` runs ONE sandboxed DuckDB query over the ``steps`` view
of a selection (``where``/``filter`` narrowed it first: the view holds only
its episodes, and only the step columns the SQL names) and returns the anchor steps as ``(episode k, step t, weight)``
arrays in ``(k, t)`` order, cached per snapshot: a snapshot never changes, so
a second stream or draw over it costs no query.

:class:`AnchorIndex` is a :class:`~episodelake.segment_index.SegmentIndex`
whose segment ids enumerate the kept anchors, episode after episode, step
after step: segment ``i`` is episode ``episode[i]`` from transition
``starts[i] = t + offset``. With ``pad=None`` a segment is kept only when all
its ``L`` transitions lie inside its episode; with a pad mode a segment is
kept when at least one does (the slots outside are padding, ``mask``
False); segments never cross episodes. Everything that draws from a segment
index (passes, shards, samplers, priorities, resume) then draws anchors.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from typing import cast

import numpy as np

from ..core.errors import ArgumentError, QueryError
from ..read.collection import EpisodeCollection
from ..read.query import SnapshotViews, SQLResult, column_numpy, where_condition
from ..read.snapshot import Snapshot
from .options import Anchors, Window
from .segment_index import SegmentIndex

Found = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # (k into positions, step t, weight or None)
CACHED_PER_SNAPSHOT = 8  # anchor sets kept per snapshot (predicates x selections)
_CACHE: weakref.WeakKeyDictionary[Snapshot, dict[str, tuple[np.ndarray, Found]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def anchor_query(anchors: Anchors) -> tuple[str, str]:
    """The error prefix and the SQL of the anchor steps: ``episode_id, t`` (and ``weight``) of every matching row.

    The predicate comes first in the text, so positional ``?`` placeholders
    number its own before the weights'.
    """
    what, condition = where_condition(anchors.predicate, anchors.params, "Anchors")
    if anchors.weights is None:
        return what, "SELECT episode_id, t FROM steps" + condition
    weight = "CAST((\n" + anchors.weights + "\n) AS DOUBLE) AS weight"
    return what, f"WITH anchor AS (SELECT * FROM steps{condition}) SELECT episode_id, t, {weight} FROM anchor"


def find_anchors(collection: EpisodeCollection, snap: Snapshot, positions: np.ndarray, anchors: Anchors) -> Found:
    """The anchor steps of episodes ``positions`` of ``snap``: ``(k, t, weight)`` sorted by ``(k, t)``.

    ``k`` indexes ``positions``; ``weight`` is None without ``anchors.weights``,
    else checked finite and ``>= 0`` (ArgumentError naming the episode and
    step). One sandboxed query over the ``steps`` view of those episodes.
    """
    positions = np.asarray(positions, dtype=np.int64)
    key = json.dumps([anchors.predicate, anchors.weights, anchors.record()["params"]], default=repr)
    with _LOCK:
        hit = _CACHE.get(snap, {}).get(key)
    if hit is not None and np.array_equal(hit[0], positions):
        return hit[1]
    what, query = anchor_query(anchors)
    try:  # over a steps view of the columns the SQL names: DuckDB evaluates every unnest of the view
        views = SnapshotViews(collection, snap, positions, used=query)
        table = SQLResult(views, query, anchors.params, True, what).to_arrow_table()
    except QueryError:  # it reads columns without naming them (COLUMNS(...), a row struct): the whole view
        views = SnapshotViews(collection, snap, positions)
        table = SQLResult(views, query, anchors.params, True, what).to_arrow_table()
    ids = column_numpy(table.column("episode_id")).astype(np.int64, copy=False)
    t = column_numpy(table.column("t")).astype(np.int64, copy=False)
    # the view already holds only these episodes: the join back to positions keeps rows of no other
    chosen = snap.index["episode_id"][positions]
    order = np.argsort(chosen, kind="stable")
    at = np.minimum(np.searchsorted(chosen[order], ids), max(len(chosen) - 1, 0))
    inside = chosen[order][at] == ids if len(chosen) else np.zeros(len(ids), dtype=bool)
    k, t = order[at[inside]], t[inside]
    rows = np.lexsort((t, k))
    k, t = k[rows], t[rows]
    weight = None
    if anchors.weights is not None:
        weight = column_numpy(table.column("weight")).astype(np.float64)[inside][rows]
        bad = ~np.isfinite(weight) | (weight < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ArgumentError(
                f"Anchors weights {anchors.weights!r}: episode {int(chosen[k[i]])} step {int(t[i])} has weight "
                f"{float(weight[i])!r} (weights must be finite and >= 0)"
            )
    found: Found = (k, t, weight)
    with _LOCK:
        kept = _CACHE.setdefault(snap, {})
        if len(kept) >= CACHED_PER_SNAPSHOT:
            kept.pop(next(iter(kept)))
        kept[key] = (positions, found)
    return found


class AnchorIndex(SegmentIndex):
    """Segments positioned on anchors (see module docstring); shards, draws and passes as for a SegmentIndex.

    ``anchors`` are what it was built from; ``find(snap, positions)`` gives the anchors of episodes ``positions`` of
    ``snap`` (:func:`find_anchors`); a refreshed stream sets ``snap`` to the
    new version before it resets or extends the index. With anchor weights,
    a draw with replacement (:meth:`sample_uniform`) takes an anchor with
    probability proportional to its weight, and per-episode weights
    (:meth:`episode_weights_table`) multiply them.
    """

    def __init__(
        self,
        anchors: Anchors,
        find: Callable[[Snapshot, np.ndarray], Found],
        snap: Snapshot,
        positions: np.ndarray,
        lengths: np.ndarray,
        sequence_length: int,
        pad: str | None,
        shard: tuple[int, int] | None = None,
    ) -> None:
        self.anchors, self.find, self.snap, self.offset = anchors, find, snap, anchors.offset
        super().__init__(positions, lengths, sequence_length, pad, 1, shard)

    def _kept(self, k: np.ndarray, t: np.ndarray, weight: np.ndarray | None, lengths: np.ndarray) -> Found:
        """``(k, start, weight)`` of the anchors whose segment the pad rule keeps."""
        start, L, T = t + self.offset, self.sequence_length, lengths[k]
        keep = (start >= 0) & (start + L <= T) if self.pad is None else (start < T) & (start + L > 0)
        return k[keep], start[keep], None if weight is None else weight[keep]

    def reset(self, positions: np.ndarray, lengths: np.ndarray) -> None:
        """Index the anchors of these episodes instead (found in ``snap``)."""
        if positions.shape != lengths.shape:
            raise ArgumentError("positions and lengths must have the same shape")
        self.positions, self.lengths = positions, lengths
        self.episode, self.starts, self.weight = self._kept(*self.find(self.snap, positions), lengths)
        self.counts = np.bincount(self.episode, minlength=len(positions)).astype(np.int64)
        self.cum = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.shard_cum = self._shard_cum(self.cum)
        self._finish()

    def extend(self, positions: np.ndarray, lengths: np.ndarray) -> None:
        """Append the anchors of episodes appended at the end (``positions``: all, old first; ``lengths``: new)."""
        positions = np.asarray(positions, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        old = len(self.positions)
        if len(positions) != old + len(lengths):
            raise ArgumentError("extend: positions must list the old episodes and then the appended ones")
        k, start, weight = self._kept(*self.find(self.snap, positions[old:]), lengths)
        counts = np.bincount(k, minlength=len(lengths)).astype(np.int64)
        cum = self.total + np.cumsum(counts, dtype=np.int64)
        self.positions = positions
        self.lengths = np.concatenate([self.lengths, lengths])
        self.episode = np.concatenate([self.episode, k + old])
        self.starts = np.concatenate([self.starts, start])
        if self.weight is not None:  # the same anchors, so weights on both sides
            self.weight = np.concatenate([self.weight, cast(np.ndarray, weight)])
        self.counts = np.concatenate([self.counts, counts])
        self.cum = np.concatenate([self.cum, cum])
        self.shard_cum = np.concatenate([self.shard_cum, self._shard_cum(cum)])
        self._finish()

    def _finish(self) -> None:
        super()._finish()
        self._mass: np.ndarray | None = None

    def locate_global(self, gid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(episode k, first transition)`` of global segment ids: a lookup, no search."""
        gid = np.asarray(gid, dtype=np.int64)
        return self.episode[gid], self.starts[gid]

    def item_mass(self, weight: np.ndarray) -> np.ndarray:
        """Cumulative mass over this shard's items, from one weight per global segment id."""
        mass = np.cumsum(weight[self.rank :: self.world], dtype=np.float64)
        if not len(mass) or mass[-1] <= 0:
            raise ArgumentError("weights: every anchor has weight zero")
        return mass

    def sample_uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` shard-local ids with replacement: uniform, or by the anchors' weights when they have them."""
        if self.weight is None or len(self) == 0:
            return super().sample_uniform(rng, n)
        if self._mass is None:
            self._mass = self.item_mass(self.weight)
        return self.sample_weighted(rng, n, self._mass)

    def episode_weights_table(self, weights: np.ndarray) -> np.ndarray:
        """Cumulative mass per shard-local item: its episode's weight (times its anchor weight)."""
        super().episode_weights_table(weights)  # the checks of the per-episode weights
        w = np.repeat(np.asarray(weights, dtype=np.float64), self.counts)
        return self.item_mass(w if self.weight is None else w * self.weight)

    def sample_weighted(self, rng: np.random.Generator, n: int, mass: np.ndarray) -> np.ndarray:
        """``n`` shard-local ids, with replacement, ``P(item)`` proportional to its share of ``mass``."""
        u = rng.random(n) * mass[-1]
        return np.minimum(np.searchsorted(mass, u, side="right"), len(mass) - 1).astype(np.int64)


def anchor_index(
    collection: EpisodeCollection,
    snap: Snapshot,
    positions: np.ndarray,
    anchors: Anchors,
    window: Window,
    shard: tuple[int, int] | None = None,
) -> AnchorIndex:
    """The :class:`AnchorIndex` of ``window``'s segments on ``anchors`` over episodes ``positions`` of ``snap``."""
    if window.stride != 1:
        raise ArgumentError(f"anchors: window stride={window.stride} does not apply, segments start at their anchors")

    def find(at: Snapshot, chosen: np.ndarray) -> Found:
        return find_anchors(collection, at, chosen, anchors)

    return AnchorIndex(anchors, find, snap, positions, snap.lengths[positions], window.size, window.pad, shard)
