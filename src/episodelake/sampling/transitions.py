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

Which transitions (``sampler=``, :mod:`.options`): ``el.Uniform()`` with
replacement by default; ``el.Weighted(weights)`` (per-episode, as for
streams); ``el.Prioritized(priority, alpha, beta)`` (prioritized replay,
:mod:`episodelake.priority`); or a :class:`~episodelake.samplers.Sampler`
over a segment index of length-1 segments (one id per transition). A
:class:`~episodelake.samplers.PrioritizedSampler` kept across calls keeps the
priorities (``sampler.update_priorities(tr.indices, ...)``), also while the
dataset grows or loses episodes.

``anchors=el.Anchors(predicate, offset)`` draws only transitions
``t + offset`` of the steps ``t`` the predicate picks (those inside their
episode), uniformly or by the anchors' ``weights`` (:mod:`.anchors`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from ..core.errors import ArgumentError
from ..core.transforms import Transform, apply_transforms, check_transforms
from ..read.batching import WindowReader, reader_for
from ..read.collection import EpisodeCollection
from ..read.selection import episode_weights, select
from ..read.snapshot import Snapshot
from .anchors import anchor_index
from .batch import Transitions
from .options import Anchors, Strategy, Weighted, Window, anchors_of, kind_of, sampler_of
from .priority import bind, prioritized_sampler
from .samplers import Sampler
from .segment_index import SegmentIndex, check_positive, check_seed

TRANSITION_SAMPLERS = ("uniform", "weighted", "prioritized", "sampler")  # draws with replacement only
# the transition index of each snapshot's last selection: repeated draws from one collection skip rebuilding it
_INDEXES: weakref.WeakKeyDictionary[Snapshot, tuple[np.ndarray, SegmentIndex]] = weakref.WeakKeyDictionary()


def transition_index(snap: Snapshot, positions: np.ndarray) -> SegmentIndex:
    """The index of every transition of ``positions`` (segments of length 1), cached per snapshot."""
    cached = _INDEXES.get(snap)
    if cached is not None and np.array_equal(cached[0], positions):
        return cached[1]
    index = SegmentIndex(positions, snap.lengths[positions], 1)
    _INDEXES[snap] = (positions, index)
    return index


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
    column = t[:, None]  # windows of one row are this view: no arithmetic in the common k = h = n = 1 case
    obs_rows = column if k == 1 else column - k + 1 + np.arange(k)
    if n == 1:  # next stack is the obs stack shifted by one: one (k + 1)-row window
        rows, next_at = np.concatenate([obs_rows, (t + 1)[:, None]], axis=1), 1
    else:
        rows, next_at = np.concatenate([obs_rows, obs_rows + m[:, None]], axis=1), k
    act_rows = column if h == 1 else column + np.arange(h)
    rew_rows = column if n == 1 else column + np.arange(n)
    buffers: dict[str, Any] = {}
    for f in reader.schema.step_fields:
        if f.role == "observation":
            buffers[f.key] = reader.gather(f, pos, rows)
        elif f.role == "action":
            buffers[f.key] = reader.gather(f, pos, act_rows)
        elif f.role == "reward":
            r = reader.gather(f, pos, rew_rows)
            dtype = np.result_type(r.dtype, np.float32)
            if n == 1:  # the sum of one reward: itself (exactly what the float64 sum would round back to)
                buffers[f.key] = r[:, 0].astype(dtype)
            else:
                powers = gamma ** np.arange(n)
                buffers[f.key] = np.einsum("bn...,n->b...", r.astype(np.float64), powers).astype(dtype)
        else:
            buffers[f.key] = reader.gather(f, pos, column)[:, 0]
    ends = t + m == T
    terminated = ends & reader.terminated[pos]
    buffers.update(
        terminated=terminated,
        truncated=ends & reader.truncated[pos],
        discount=np.where(terminated, np.float32(0), np.float32(gamma) if n == 1 else (gamma**m).astype(np.float32)),
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
    collection: EpisodeCollection,
    batch_size: int,
    *,
    n_step: int = 1,
    gamma: float = 0.99,
    history: int = 1,
    horizon: int = 1,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    sampler: Strategy | Sampler | None = None,
    where: str | None = None,
    filter: Callable[[Any], bool] | None = None,
    transform: Mapping[str, Transform] | None = None,
    anchors: Anchors | None = None,
) -> Transitions:
    """``batch_size`` transitions drawn with replacement from ``collection``: uniformly by default.

    Pass ``rng`` (a ``np.random.Generator``) for a reproducible sequence of
    calls; ``seed`` makes this one call deterministic. ``where``/``filter``
    narrow the episodes first. ``sampler``: ``el.Uniform()`` (None),
    ``el.Weighted(weights)`` (per-episode weights, as for ``segment_stream``),
    ``el.Prioritized(priority, alpha, beta)`` (one prioritized draw from the
    given priorities), a :class:`~episodelake.samplers.Sampler` over
    transition ids, or a :class:`~episodelake.samplers.PrioritizedSampler`
    (kept across calls: its own generator, ``alpha``, ``beta``; transitions
    it has not seen start at its ``priority``, else at the largest priority
    seen). A prioritized batch
    has ``indices`` and ``weights`` (see
    :class:`~episodelake.samplers.PrioritizedSampler`). ``transform``: per
    field, a :class:`~episodelake.transforms.FrameTransform` or callable
    applied to the batch's buffers. ``anchors``: draw only the transitions
    ``offset`` steps from the steps an :class:`~episodelake.options.Anchors`
    predicate picks (by its ``weights`` when given: with el.Uniform or
    el.Weighted only).
    """
    B = check_positive(batch_size, "batch_size")
    n = check_positive(n_step, "n_step")
    k = check_positive(history, "history")
    h = check_positive(horizon, "horizon")
    gamma = check_gamma(gamma)
    seed = check_seed(seed)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ArgumentError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    strategy = sampler_of(sampler, "sample_transitions", TRANSITION_SAMPLERS)
    anchors = anchors_of(anchors)
    if anchors is not None and anchors.weights is not None and kind_of(strategy) not in ("uniform", "weighted"):
        raise ArgumentError("anchors: weights apply to el.Uniform() and el.Weighted draws, not priorities or a Sampler")
    custom = kind_of(strategy) == "sampler"
    if custom and (seed is not None or rng is not None):
        raise ArgumentError("seed and rng apply to the built-in draws: a Sampler object draws with its own generator")
    per = prioritized_sampler(strategy, seed if rng is None else rng)
    snap, positions = select(collection, where, filter)
    transforms = check_transforms(snap.schema, transform)
    if anchors is None:
        index = transition_index(snap, positions)
    else:  # transitions are anchored segments of length 1 that lie inside their episode
        index = anchor_index(collection, snap, positions, anchors, Window(1, pad=None))
    drawn: tuple[np.ndarray, np.ndarray] | None = None
    if per is not None:
        bind(per, collection, snap, positions, index, per.priority)
        local, slots, importance = per.draw(B)
        drawn = (slots, importance)
    elif custom:
        local = np.asarray(cast(Sampler, strategy).sample(index, B))
    else:  # a new generator only here: seeding one from fresh entropy costs more than a prioritized draw
        rng = np.random.default_rng(seed) if rng is None else rng
        if isinstance(strategy, Weighted):
            mass = index.episode_weights_table(episode_weights(collection, snap, positions, strategy.weights))
            local = index.sample_weighted(rng, B, mass)
        else:
            local = index.sample_uniform(rng, B)
    # a user sampler's ids are checked; built-in draws are in range (one shard: local ids are global)
    which, t = index.locate(local) if custom and per is None else index.locate_global(local)
    out = build_transitions(reader_for(snap), positions[which], t, n, gamma, k, h)
    apply_transforms(out.buffers, snap.schema, transforms)
    if drawn is not None:
        out.indices, out.weights = drawn
    return out
