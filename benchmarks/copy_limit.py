"""The copy limit of a sampling benchmark: random windows gathered by NumPy from arrays in memory, one thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def window_sampler(
    obs: Sequence[np.ndarray], per_step: Sequence[np.ndarray], episodes: int, length: int, seq: int, batch: int
) -> Callable[[], None]:
    """One batch of ``batch`` random windows of ``seq`` transitions per call, one fancy index per array.

    ``obs`` arrays hold ``length + 1`` rows per episode, ``per_step`` arrays
    ``length``, episode after episode, so a window copies what a sampled
    segment of the same geometry does.
    """
    rng = np.random.default_rng(2)
    obs_rows, step_rows = np.arange(seq + 1), np.arange(seq)

    def sample() -> None:
        e, s = rng.integers(0, episodes, batch), rng.integers(0, length - seq + 1, batch)
        for a in obs:
            a[(e * (length + 1) + s)[:, None] + obs_rows]
        for a in per_step:
            a[(e * length + s)[:, None] + step_rows]

    return sample
