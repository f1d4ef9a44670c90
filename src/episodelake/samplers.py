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
:class:`WeightedSampler` with ``weights=``. Both draw with replacement from a
NumPy generator they own and save its state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .segment_index import SegmentIndex


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
