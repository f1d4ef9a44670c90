"""Samplers: which segments a stream draws next (the ``sampler=`` protocol and the built-in samplers).

A sampler is any object with ``sample(index, batch_size)`` (:class:`Sampler`)
returning segment ids of ``index`` (a :class:`~episodelake.segment_index.SegmentIndex`:
this rank's shard, so ids are shard-local, in ``[0, len(index))``;
``index.locate(ids)`` gives each one's episode and start). An empty result
ends the stream. A sampler that also has ``state_dict()`` (plain,
deep-copyable values) and ``load_state_dict(state)`` (:class:`StatefulSampler`)
is saved by the stream's ``state_dict()`` and restored by its
``load_state_dict()``, which makes resume exact.

:class:`~episodelake.stream.SegmentStream` draws through this protocol
whether the sampler is the user's (``sampler=``) or built in: a shuffled
stream with replacement uses :class:`UniformSampler`, or
:class:`WeightedSampler` with ``weights=``, or :class:`PrioritizedSampler`
with ``priority=``. They draw with replacement from a NumPy generator they
own and save its state.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..core.errors import ArgumentError
from .segment_index import SegmentIndex
from .sumtree import SumTree


class Sampler(Protocol):
    """What ``segment_stream(sampler=...)`` accepts."""

    def sample(self, index: SegmentIndex, batch_size: int) -> npt.ArrayLike:
        """Up to ``batch_size`` integer segment ids in ``[0, len(index))``; none ends the stream."""
        ...


class StatefulSampler(Sampler, Protocol):
    """A :class:`Sampler` whose state a stream saves and restores."""

    def state_dict(self) -> Any:
        """The sampler's state as plain, deep-copyable values."""
        ...

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state``, a value :meth:`state_dict` returned."""
        ...


class UniformSampler:
    """Segments uniform with replacement, from a generator seeded by ``seed`` (``np.random.default_rng``)."""

    def __init__(self, seed: int | Sequence[int]) -> None:
        self.rng = np.random.default_rng(seed)

    def sample(self, index: SegmentIndex, batch_size: int) -> np.ndarray:
        return index.sample_uniform(self.rng, batch_size)

    def state_dict(self) -> Mapping[str, Any]:
        """The generator's bit-generator state."""
        return self.rng.bit_generator.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state


class WeightedSampler(UniformSampler):
    """Segments with replacement, ``P(segment) ∝`` its episode's weight.

    ``mass`` is the index's cumulative mass table,
    :meth:`SegmentIndex.episode_weights_table` of the per-episode weights.
    """

    def __init__(self, seed: int | Sequence[int], mass: np.ndarray) -> None:
        super().__init__(seed)
        self.mass = mass

    def sample(self, index: SegmentIndex, batch_size: int) -> np.ndarray:
        return index.sample_weighted(self.rng, batch_size, self.mass)


def check_exponent(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ArgumentError(f"{name} must be a finite number >= 0, got {value!r}")
    if not np.isfinite(value) or value < 0:
        raise ArgumentError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_priorities(values: npt.ArrayLike, what: str) -> np.ndarray:
    """``values`` as float64, or ArgumentError naming the first value that is not finite and >= 0."""
    try:
        p = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"priorities must be numbers: {exc}") from None
    if p.size and p.min() >= 0 and np.isfinite(p.max()):  # the common case in two reductions (NaN fails both)
        return p
    bad = ~np.isfinite(p) | (p < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ArgumentError(f"priority of {what} #{i} is {float(p.ravel()[i])!r}: priorities must be finite and >= 0")
    return p


class PrioritizedSampler:
    """Prioritized replay (Schaul et al., 2016): ``P(i) = p_i**alpha / sum_j p_j**alpha``, with replacement.

    Items (segments or transitions) live in slots of a :class:`~episodelake.sumtree.SumTree`,
    keyed by episode: every episode the sampler meets gets the next free run of
    slots, and keeps it for the sampler's life, so an index handed out
    (``batch.indices``) stays valid while the collection grows, narrows or
    loses episodes (their slots then drop out of the draw; an update to them
    is kept but not drawn). Items the sampler has not seen before get the
    starting priorities ``priority`` gives (as ``el.Prioritized(priority)``
    does: see :mod:`episodelake.priority`) or, without it, the largest
    priority seen so far (1.0 at first), as in the paper.

    :meth:`draw` returns the sampled items, their slots and importance weights
    ``w_i = (N * P(i)) ** -beta / max_batch w`` (``N``: items in the current
    collection); :meth:`update_priorities` sets new priorities in
    ``O(log n)`` NumPy calls per batch. A priority of 0 is never drawn.
    ``state_dict()`` holds the generator and every priority.
    """

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        seed: int | Sequence[int] | np.random.Generator | None = None,
        *,
        priority: Any = None,
    ) -> None:
        self.alpha = check_exponent(alpha, "alpha")
        self.beta = check_exponent(beta, "beta")
        self.priority = priority  # new items' starting priorities (None: the largest seen), read when bound
        self.rng = np.random.default_rng(seed)
        self.max_priority = 1.0
        self._tree = SumTree()
        self._raw = np.zeros(0)  # priorities as given, per slot (the tree holds p ** alpha of live slots)
        self._live = np.zeros(0, dtype=bool)
        self._episodes: dict[int, tuple[int, int]] = {}  # episode id -> (first slot, slots)
        self._bound: tuple[np.ndarray, np.ndarray] | None = None  # (episode ids, counts) of the bound index
        # what episodelake.priority.bind last bound (snapshot and index arrays, compared by identity);
        # None after any other bind or a loaded state
        self.bound_key: tuple[Any, ...] | None = None
        self._to_local: np.ndarray | None = None  # slot -> local id of the bound index; None: the identity
        self._size = 0

    def _powered(self, p: np.ndarray) -> np.ndarray:
        """``p ** alpha``, and 0 for ``p = 0`` also when ``alpha = 0``."""
        return p**self.alpha if self.alpha > 0 else (p > 0).astype(np.float64)

    def bind(self, episode_ids: np.ndarray, counts: np.ndarray, initial: Any = None) -> None:
        """Draw from the items of these episodes (``counts[e]`` items each, local ids in this order).

        ``initial()`` gives per-item priorities ``[sum(counts)]`` of the index
        (called only if some episode is new); None: the largest priority seen.
        """
        self.bound_key = None
        episode_ids = np.asarray(episode_ids, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if (
            self._bound is not None
            and np.array_equal(self._bound[0], episode_ids)
            and np.array_equal(self._bound[1], counts)
        ):
            return
        if self._append(episode_ids, counts, initial):
            return
        ids, n = episode_ids.tolist(), counts.tolist()
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        new = [e for e, i in enumerate(ids) if i not in self._episodes]
        for e, i in enumerate(ids):
            if i in self._episodes and self._episodes[i][1] != n[e]:
                raise ArgumentError(
                    f"episode {i} has {n[e]} items here but {self._episodes[i][1]} in this PrioritizedSampler "
                    "(a sampler keeps the items of one kind: use one per sequence_length/pad/stride/shard)"
                )
        if new:
            values = None if initial is None else check_priorities(initial(), "item")
            is_new = np.zeros(len(ids), dtype=bool)
            is_new[new] = True
            take = np.flatnonzero(np.repeat(is_new, counts))
            fresh = np.full(len(take), self.max_priority) if values is None else values[take]
            if len(fresh):
                self.max_priority = max(self.max_priority, float(fresh.max()))
            at = len(self._raw)
            self._tree.extend(np.zeros(len(take)))
            self._raw = np.concatenate([self._raw, fresh])
            self._live = np.concatenate([self._live, np.zeros(len(take), dtype=bool)])
            for e in new:
                self._episodes[ids[e]] = (at, n[e])
                at += n[e]
        first = np.array([self._episodes[i][0] for i in ids], dtype=np.int64)
        live = np.zeros(len(self._raw), dtype=bool)
        slots = np.repeat(first - starts[:-1], counts) + np.arange(starts[-1])  # local id -> slot
        live[slots] = True
        changed = np.flatnonzero(live != self._live)
        self._tree.update(changed, np.where(live[changed], self._powered(self._raw[changed]), 0.0))
        self._live = live
        self._size = int(starts[-1])
        if np.array_equal(slots, np.arange(len(slots))):
            self._to_local = None
        else:
            self._to_local = np.full(len(self._raw), -1, dtype=np.int64)
            self._to_local[slots] = np.arange(len(slots))
        self._bound = (episode_ids, counts)

    def _append(self, episode_ids: np.ndarray, counts: np.ndarray, initial: Any) -> bool:
        """:meth:`bind` when the bound episodes come first and the rest are new: ``O(new items)``; else False.

        A learner's collection grows at its end: the new episodes' items get
        fresh slots at the end of the tree, live at once.
        """
        if self._bound is None:
            return False
        n = len(self._bound[0])
        if len(episode_ids) <= n or not (
            np.array_equal(self._bound[0], episode_ids[:n]) and np.array_equal(self._bound[1], counts[:n])
        ):
            return False
        new_ids, new_counts = episode_ids[n:].tolist(), counts[n:]
        if any(i in self._episodes for i in new_ids):
            return False  # an episode seen before (its slots exist): the general path
        m = int(new_counts.sum())
        if initial is None:
            fresh = np.full(m, self.max_priority)
        else:
            fresh = check_priorities(initial(), "item")[self._size :]
            if len(fresh):
                self.max_priority = max(self.max_priority, float(fresh.max()))
        at = len(self._raw)
        self._tree.extend(self._powered(fresh))
        self._raw = np.concatenate([self._raw, fresh])
        self._live = np.concatenate([self._live, np.ones(m, dtype=bool)])
        for i, first, c in zip(new_ids, at + np.cumsum(new_counts) - new_counts, new_counts.tolist(), strict=True):
            self._episodes[i] = (int(first), c)
        if self._to_local is not None or at != self._size:  # slots and local ids part ways
            if self._to_local is None:
                self._to_local = np.full(at, -1, dtype=np.int64)
                self._to_local[: self._size] = np.arange(self._size)
            self._to_local = np.concatenate([self._to_local, self._size + np.arange(m, dtype=np.int64)])
        self._size += m
        self._bound = (episode_ids, counts)
        return True

    def draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(local ids, slots, importance weights float32)`` of ``batch_size`` items of the bound index."""
        if self._size == 0:
            raise ArgumentError("no segments to sample: every episode is filtered out or shorter than the sequence")
        total = self._tree.total
        if total <= 0:
            raise ArgumentError("priority: every item has priority 0")
        slots, v = self._tree.sample_values(self.rng, batch_size)
        # (N * P(i)) ** -beta / max_batch(...) is (min_batch leaf / leaf_i) ** beta: N and the total cancel
        weights = ((v.min() / v) ** self.beta).astype(np.float32)
        local = slots if self._to_local is None else self._to_local[slots]
        return local, slots, weights

    def sample(self, index: SegmentIndex, batch_size: int) -> np.ndarray:
        """The :class:`Sampler` protocol: local ids of the bound index (bind it to ``index`` first)."""
        return self.draw(batch_size)[0]

    def update_priorities(self, indices: npt.ArrayLike, priorities: npt.ArrayLike) -> None:
        """Set the priorities of slots ``indices`` (``batch.indices``); the last value wins for a repeated slot.

        ``O(log n)`` NumPy calls for the whole batch. Raises ArgumentError,
        changing nothing, on an index out of range or a priority that is not
        finite and >= 0.
        """
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise ArgumentError(f"update_priorities: indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).ravel()
        p = check_priorities(priorities, "item").ravel()
        if p.shape != idx.shape:
            raise ArgumentError(f"update_priorities: {len(idx)} indices but {len(p)} priorities")
        if not len(idx):
            return
        ranked = np.sort(idx)  # its ends check the range, its neighbours find repeats (rare: then sort again)
        if ranked[0] < 0 or ranked[-1] >= len(self._raw):
            bad = idx[(idx < 0) | (idx >= len(self._raw))][0]
            raise ArgumentError(f"update_priorities: index {int(bad)} out of range for {len(self._raw)} items")
        if not (ranked[1:] != ranked[:-1]).all():
            idx, p = self._tree.last_wins(idx, p)
        self._raw[idx] = p
        self._tree.update(idx, self._powered(p) * self._live[idx], unique=True)
        self.max_priority = max(self.max_priority, float(p.max()))

    @property
    def priorities(self) -> np.ndarray:
        """Every slot's priority as given (a copy), ``[slots]``; slots of absent episodes included."""
        return self._raw.copy()

    def probabilities(self) -> np.ndarray:
        """``P(slot)`` of the bound collection, ``[slots]`` (0 for absent episodes' slots)."""
        return self._tree.leaves / self._tree.total

    def priority_state(self) -> dict[str, Any]:
        """``{"priorities": array copy, "max_priority": float}``: what a stream's state adds."""
        return {"priorities": self._raw.copy(), "max_priority": self.max_priority}

    def check_priority_state(self, state: Any) -> None:
        """ArgumentError unless ``state`` holds priorities for exactly this sampler's slots."""
        if not isinstance(state, dict) or "priorities" not in state:
            raise ArgumentError("state_dict: no priorities saved, but this stream is prioritized")
        p = check_priorities(state["priorities"], "saved slot")
        if p.shape != self._raw.shape:
            raise ArgumentError(f"state_dict: {p.size} priorities saved, this sampler has {self._raw.size} slots")
        check_exponent(state.get("max_priority"), "state_dict max_priority")

    def load_priority_state(self, state: dict[str, Any]) -> None:
        """Continue from priorities :meth:`priority_state` returned (checked by :meth:`check_priority_state`)."""
        self.check_priority_state(state)
        self._raw = np.array(state["priorities"], dtype=np.float64)
        self.max_priority = float(state["max_priority"])
        slots = np.arange(len(self._raw))
        self._tree.update(slots, np.where(self._live, self._powered(self._raw), 0.0), unique=True)

    def state_dict(self) -> dict[str, Any]:
        """Generator, priorities and the episode -> slots layout (NumPy arrays and plain values)."""
        ids = np.fromiter(self._episodes, dtype=np.int64, count=len(self._episodes))
        layout = np.array(list(self._episodes.values()), dtype=np.int64).reshape(-1, 2)
        return {
            "rng": copy.deepcopy(self.rng.bit_generator.state),
            "alpha": self.alpha,
            "beta": self.beta,
            "episodes": ids,
            "first_slot": layout[:, 0].copy(),
            "slots": layout[:, 1].copy(),
            **self.priority_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (the next draw binds the collection again)."""
        if not isinstance(state, dict) or not {"rng", "episodes", "first_slot", "slots", "priorities"} <= set(state):
            raise ArgumentError("PrioritizedSampler.load_state_dict: not a PrioritizedSampler state")
        raw = check_priorities(state["priorities"], "saved slot")
        ids, first, n = (np.asarray(state[k], dtype=np.int64) for k in ("episodes", "first_slot", "slots"))
        if not (ids.shape == first.shape == n.shape) or int(n.sum()) != raw.size:
            raise ArgumentError("PrioritizedSampler.load_state_dict: the episode layout does not match the priorities")
        self.alpha = check_exponent(state.get("alpha", self.alpha), "alpha")
        self.beta = check_exponent(state.get("beta", self.beta), "beta")
        self.rng.bit_generator.state = copy.deepcopy(state["rng"])
        self.max_priority = check_exponent(state.get("max_priority"), "state_dict max_priority")
        self._raw = raw.copy()
        self._live = np.zeros(raw.size, dtype=bool)
        self._episodes = {i: (f, c) for i, f, c in zip(ids.tolist(), first.tolist(), n.tolist(), strict=True)}
        self._tree = SumTree()
        self._tree.extend(np.zeros(raw.size))
        self._bound, self._to_local, self._size, self.bound_key = None, None, 0, None
