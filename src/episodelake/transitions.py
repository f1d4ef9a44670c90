"""Single transitions (time axis removed): n-step returns, frame stacks, action chunks.

For a sampled transition ``t`` of an episode with ``T`` transitions and
``n_step = n``, the window ends after ``m = min(n, T - t)`` steps:

* ``reward``: ``sum_{i < m} gamma**i * r[t + i]`` (per reward field);
* ``next_obs``: observation ``t + m``;
* ``terminated``/``truncated``: the window reaches the episode's end and the
  episode terminated / was truncated there;
* ``discount``: ``gamma**m`` to bootstrap with, ``0`` after ``terminated``
  (a truncated episode still bootstraps from its final observation);
* ``n_steps``: ``m``.

``history = k`` stacks observations ``t - k + 1 .. t`` (``[B, k, ...]``;
frames before the episode start are zeros with ``obs_mask`` False) and
``next_obs`` likewise ends at ``t + m``. ``horizon = h`` gives actions
``t .. t + h - 1`` (``[B, h, ...]``, zeros past the end with ``action_mask``
False). With ``k = 1``/``h = 1`` those axes are dropped.

``meta`` holds typed per-episode values ``[B, ...]`` and ``meta_mask`` one
bool per item (False where the value is unset and holds the fill value; see
:mod:`episodelake.segments`).

Observation fields are read as one buffer per field (``obs`` and ``next_obs``
are views of it), so ``map(fn)`` converts each buffer once. The batch is a
:class:`~episodelake.batch.Transitions`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .batch import Transitions
from .batching import WindowReader, reader_for
from .errors import ArgumentError
from .segment_index import SegmentIndex, check_positive, check_seed
from .selection import select


def check_gamma(gamma: float) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise ArgumentError(f"gamma must be a number in [0, 1], got {gamma!r}")
    return float(gamma)


def build_transitions(
    reader: WindowReader,
    pos: np.ndarray,
    t: np.ndarray,
    n_step: int = 1,
    gamma: float = 0.99,
    history: int = 1,
    horizon: int = 1,
) -> Transitions:
    """Transitions ``t`` (episode-relative) of snapshot episodes ``pos`` (see module docstring)."""
    pos = np.asarray(pos, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    n, k, h = n_step, history, horizon
    T = reader.lengths[pos]
    if len(t) and ((t < 0) | (t >= T)).any():
        raise IndexError("transition index outside its episode")
    m = np.minimum(n, T - t)
    obs_rows = t[:, None] - k + 1 + np.arange(k)
    if n == 1:  # next stack is the obs stack shifted by one: one (k + 1)-row window
        rows, next_at = np.concatenate([obs_rows, (t + 1)[:, None]], axis=1), 1
    else:
        rows, next_at = np.concatenate([obs_rows, obs_rows + m[:, None]], axis=1), k
    act_rows = t[:, None] + np.arange(h)
    rew_rows = t[:, None] + np.arange(n)
    powers = gamma ** np.arange(n)
    buffers: dict[str, Any] = {}
    for f in reader.schema.step_fields:
        if f.role == "observation":
            buffers[f.key] = reader.gather(f, pos, rows)
        elif f.role == "action":
            buffers[f.key] = reader.gather(f, pos, act_rows)
        elif f.role == "reward":
            r = reader.gather(f, pos, rew_rows)
            dtype = np.result_type(r.dtype, np.float32)
            buffers[f.key] = np.einsum("bn...,n->b...", r.astype(np.float64), powers).astype(dtype)
        else:
            buffers[f.key] = reader.gather(f, pos, t[:, None])[:, 0]
    ends = t + m == T
    terminated = ends & reader.terminated[pos]
    buffers.update(
        terminated=terminated,
        truncated=ends & reader.truncated[pos],
        discount=np.where(terminated, 0.0, gamma**m).astype(np.float32),
        n_steps=m,
        obs_mask=obs_rows >= 0,
        next_obs_mask=rows[:, next_at : next_at + k] >= 0,
        action_mask=act_rows < T[:, None],
        episode_id=reader.episode_ids[pos],
        start=t,
    )
    for name, col in reader.meta.items():
        buffers[f"meta/{name}"] = col[pos]
        buffers[f"meta_mask/{name}"] = reader.meta_valid[name][pos]
    return Transitions(reader.schema, buffers, k, h, next_at)


def sample_transitions(
    collection: Any,
    batch_size: int,
    *,
    n_step: int = 1,
    gamma: float = 0.99,
    history: int = 1,
    horizon: int = 1,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    where: str | None = None,
    filter: Callable[[Any], bool] | None = None,
) -> Transitions:
    """``batch_size`` transitions drawn uniformly (with replacement) from ``collection``.

    Pass ``rng`` (a ``np.random.Generator``) for a reproducible sequence of
    calls; ``seed`` makes this one call deterministic. ``where``/``filter``
    narrow the episodes first.
    """
    B = check_positive(batch_size, "batch_size")
    n = check_positive(n_step, "n_step")
    k = check_positive(history, "history")
    h = check_positive(horizon, "horizon")
    gamma = check_gamma(gamma)
    if rng is None:
        rng = np.random.default_rng(check_seed(seed))
    elif not isinstance(rng, np.random.Generator):
        raise ArgumentError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    snap, positions = select(collection, where, filter)
    index = SegmentIndex(positions, snap.lengths[positions], 1)
    which, t = index.locate(index.sample_uniform(rng, B))
    return build_transitions(reader_for(snap), positions[which], t, n, gamma, k, h)
