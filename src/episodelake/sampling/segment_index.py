"""The segment index: every valid segment of a collection for one sequence length.

Segment ids ``0 .. N - 1`` enumerate, episode after episode (in collection
order), the starts ``0, stride, 2 * stride, ...`` up to ``T - L`` of each
episode with ``T >= L`` transitions. An episode shorter than ``L`` has one
padded segment (``pad="suffix"``: real transitions first; ``pad="prefix"``:
real transitions last) or none (``pad=None``). Segments never cross episode
boundaries.

The index keeps only per-episode arrays (counts and their cumulative sums), so
memory is ``O(episodes)`` whatever the number of steps. Locating a segment id
is one binary search over the episodes (vectorized over a batch); drawing a
uniform segment is one random integer; drawing with per-episode weights is
one random number and one binary search over cumulative weights.

``shard=(rank, world_size)`` restricts the index to ids ``i`` with
``i % world_size == rank``: shards are disjoint, cover every segment, and
differ in size by at most one. Local ids ``0 .. len(index) - 1`` of a shard map
to global ids ``rank + world_size * local``. (Finite passes of a sharded
:class:`~episodelake.stream.SegmentStream` do not use this split: they
deal global positions round-robin so that every rank gets as many batches.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.errors import ArgumentError

PAD_MODES = ("suffix", "prefix", None)
GUIDE_MIN_BATCH_SHARE = 64  # a draw of fewer than episodes / 64 ids binary-searches rather than build the guide


def check_pad(pad: str | None, name: str = "pad") -> str | None:
    if pad not in PAD_MODES:
        raise ArgumentError(f"{name} must be 'suffix', 'prefix' or None, got {pad!r}")
    return pad


def check_positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_seed(seed: object) -> int | None:
    """``seed`` as an int (or None); anything else is a ArgumentError naming the argument."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
        raise ArgumentError(f"seed must be an int >= 0 or None, got {seed!r}")
    return None if seed is None else int(seed)


def check_shard(rank: object, world: object) -> tuple[int, int]:
    """``(rank, world)`` as ints, or ArgumentError naming the bad one."""
    w = check_positive(world, "shard world")
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < w:
        raise ArgumentError(f"shard rank must be an int in [0, {w}), got {rank!r}")
    return int(rank), w


class SegmentIndex:
    """Valid segments of episodes with the given lengths (see module docstring).

    Args:
        positions: snapshot positions of the episodes, in collection order.
        lengths: transitions per episode (same order).
        sequence_length: transitions per segment ``L``.
        pad: ``"suffix"``, ``"prefix"`` or None (skip episodes shorter than ``L``).
        stride: distance between consecutive starts within an episode.
        shard: ``(rank, world_size)``; None is ``(0, 1)``.
    """

    def __init__(
        self,
        positions: np.ndarray,
        lengths: np.ndarray,
        sequence_length: int,
        pad: str | None = "suffix",
        stride: int = 1,
        shard: Sequence[int] | None = None,
    ) -> None:
        self.sequence_length = check_positive(sequence_length, "sequence_length")
        self.stride = check_positive(stride, "stride")
        self.pad = check_pad(pad)
        self.rank, self.world = (0, 1) if shard is None else check_shard(*shard)
        self.reset(np.asarray(positions, dtype=np.int64), np.asarray(lengths, dtype=np.int64))

    def reset(self, positions: np.ndarray, lengths: np.ndarray) -> None:
        """Index these episodes instead (same sequence length, pad, stride and shard)."""
        if positions.shape != lengths.shape:
            raise ArgumentError("positions and lengths must have the same shape")
        self.positions, self.lengths = positions, lengths
        self.counts = self._counts(lengths)
        self.cum = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.shard_cum = self._shard_cum(self.cum)
        self._finish()

    def _counts(self, lengths: np.ndarray) -> np.ndarray:
        L = self.sequence_length
        full = np.where(lengths >= L, (lengths - L) // self.stride + 1, 0)
        short = (lengths < L) & (lengths > 0)
        return full + (short if self.pad is not None else 0)

    def _shard_cum(self, cum: np.ndarray) -> np.ndarray:
        # shard-local counts per episode: ids in [cum[k], cum[k + 1]) congruent to rank
        first = -((self.rank - cum) // self.world)  # ceil((cum - rank) / world)
        return np.maximum(first, 0)

    def _finish(self) -> None:
        self.total = int(self.cum[-1])
        self.shard_counts = np.diff(self.shard_cum)
        self._guide: np.ndarray | None = None

    def extend(self, positions: np.ndarray, lengths: np.ndarray) -> None:
        """Append episodes at the end of the collection: ``O(new episodes)`` of arithmetic.

        ``positions`` are the snapshot positions of ALL episodes, old ones
        first (they may have moved, e.g. when an episode outside the
        collection was removed); ``lengths`` those of the appended episodes
        only. Segment ids of the old episodes keep their meaning.
        """
        positions = np.asarray(positions, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(positions) != len(self.positions) + len(lengths):
            raise ArgumentError("extend: positions must list the old episodes and then the appended ones")
        counts = self._counts(lengths)
        cum = self.total + np.cumsum(counts, dtype=np.int64)
        self.positions = positions
        self.lengths = np.concatenate([self.lengths, lengths])
        self.counts = np.concatenate([self.counts, counts])
        self.cum = np.concatenate([self.cum, cum])
        self.shard_cum = np.concatenate([self.shard_cum, self._shard_cum(cum)])
        self._finish()

    @property
    def guide(self) -> np.ndarray:
        """Guide table (Chen & Asau): bucket ``b`` of the segment ids starts in episode ``guide[b]``.

        Built on first use after a change, so an index that grows between
        small draws never pays for it (they binary-search instead).
        """
        if self._guide is None:
            edges = (np.arange(self.buckets, dtype=np.int64) * self.total) // self.buckets
            self._guide = np.searchsorted(self.cum, edges, side="right") - 1
        return self._guide

    @property
    def buckets(self) -> int:
        return max(1, len(self.counts))

    def __len__(self) -> int:
        """Segments in this shard."""
        return int(self.shard_cum[-1])

    @property
    def num_episodes(self) -> int:
        return len(self.positions)

    def to_global(self, ids: np.ndarray) -> np.ndarray:
        """Global segment ids of shard-local ``ids`` (validated)."""
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise ArgumentError(f"segment ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64, copy=False)
        n = len(self)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise IndexError(f"segment id {int(bad)} out of range for {n} segments")
        return self.rank + self.world * ids

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(episode k, first row)`` of shard-local segment ``ids``.

        ``k`` indexes ``positions``; the first row is the episode-relative
        transition index of the segment's first slot, negative when a short
        episode is prefix-padded (slot ``t`` holds transition ``row + t``).
        """
        return self.locate_global(self.to_global(ids))

    def locate_global(self, gid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` for global segment ids (any shard's), ``0 <= gid < total``."""
        gid = np.asarray(gid, dtype=np.int64)
        if gid.size * GUIDE_MIN_BATCH_SHARE < len(self.counts) and self._guide is None:
            k = np.searchsorted(self.cum, gid, side="right") - 1  # a small draw: log(episodes) each
        else:
            # locating by the guide table is a table lookup plus a short forward scan: O(1) expected per item
            k = self.guide[(gid * self.buckets) // max(self.total, 1)] if gid.size else gid
            behind = self.cum[k + 1] <= gid
            while behind.any():
                k = k + behind
                behind = self.cum[k + 1] <= gid
        row = (gid - self.cum[k]) * self.stride
        if self.pad == "prefix":
            short = self.lengths[k] - self.sequence_length
            row = np.where(short < 0, short, row)
        return k, row

    def sample_uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` shard-local ids, uniform with replacement."""
        if len(self) == 0:
            raise ArgumentError("no segments to sample: every episode is filtered out or shorter than the sequence")
        return rng.integers(0, len(self), size=n, dtype=np.int64)

    def episode_weights_table(self, weights: np.ndarray) -> np.ndarray:
        """Cumulative sampling mass per episode: a segment's weight is its episode's weight."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != self.lengths.shape:
            raise ArgumentError(f"weights: expected {len(self.lengths)} per-episode values, got shape {w.shape}")
        bad = ~np.isfinite(w) | (w < 0)
        if bad.any():
            raise ArgumentError(f"weights: episode #{int(np.flatnonzero(bad)[0])} has weight {w[bad][0]!r}")
        mass = np.cumsum(w * self.shard_counts)
        if not len(mass) or mass[-1] <= 0:
            raise ArgumentError("weights: every segment has weight zero")
        return mass

    def sample_weighted(self, rng: np.random.Generator, n: int, mass: np.ndarray) -> np.ndarray:
        """``n`` shard-local ids, with replacement, ``P(segment) ∝`` its episode's weight."""
        u = rng.random(n) * mass[-1]
        k = np.minimum(np.searchsorted(mass, u, side="right"), len(mass) - 1)
        j = np.floor(rng.random(n) * self.shard_counts[k]).astype(np.int64)
        return self.shard_cum[k] + np.minimum(j, self.shard_counts[k] - 1)
