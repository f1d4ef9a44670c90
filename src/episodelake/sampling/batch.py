"""Batch containers: :class:`SegmentBatch` (segments ``[B, L]``), :class:`Transitions` (``[B]``), collate/unbatch.

A :class:`SegmentBatch` is a :class:`~episodelake.segments.Segment` with
``time_axis=1``: observation fields hold ``[B, L + 1, ...]`` (``obs`` and
``next_obs`` are views), other fields ``[B, L, ...]``, flags and ``mask``
``[B, L]``, ``meta`` values, ``episode_id`` and ``start`` ``[B]``. Slot ``t``
of item ``b`` holds transition ``start[b] + t`` of its episode (``start`` is
negative for a prefix-padded short episode). Padding slots are zeros with
``mask`` False; in the ``L + 1`` observation buffer the rows outside the
episode's ``T + 1`` observations are zeros, so ``obs``/``next_obs`` at the one
padding slot adjacent to the real run show the neighbouring real observation.

:class:`Transitions` holds single transitions (time axis removed) as built by
:mod:`episodelake.transitions`, which documents its fields.

Prioritized draws (``priority=``) set ``indices`` (``[B]`` int64: the
sampler's slots, to hand back to ``update_priorities``) and ``weights``
(``[B]`` float32 importance weights); otherwise both are None. ``map(fn)``
converts ``weights`` and keeps ``indices`` as NumPy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ..core.episode import python_meta, rows_for
from ..core.errors import ArgumentError
from ..core.schema import DatasetSchema, role_of
from ..core.segments import RoleView, Segment, lookup, role_value
from ..read.batching import typed_meta


class SegmentBatch(Segment):
    """A batch of segments; ``context``/``target`` split it at ``context_length`` transitions.

    ``context`` covers transitions ``[0, C)`` and ``target`` ``[C, L)``; both
    are views of the same buffers, so the observation row ``C`` is the last
    ``next_obs`` of the context and the first ``obs`` of the target.
    """

    context_length: int | None = None
    indices: np.ndarray | None = None
    weights: Any = None

    @classmethod
    def wrap(cls, seg: Segment, context_length: int | None = None) -> SegmentBatch:
        out = cls.__new__(cls)
        out.__dict__.update(seg.__dict__)
        out.context_length = context_length
        return out

    def time_slice(self, start: int, stop: int) -> Segment:
        """Transitions ``[start, stop)`` as a Segment of views (observations keep one extra row)."""
        n = len(self)
        if not 0 <= start < stop <= n:
            raise IndexError(f"time slice [{start}, {stop}) outside [0, {n})")
        data = {k: self._slice(v, slice(start, rows_for(self.schema[k], stop))) for k, v in self.data.items()}
        sl = slice(start, stop)
        return Segment(
            self.schema,
            data,
            self._slice(self.terminated, sl),
            self._slice(self.truncated, sl),
            self._slice(self.mask, sl),
            self.meta.flat(),
            self.episode_id,
            None if self.start is None else self.start + start,
            self.time_axis,
            self.meta_mask.flat(),
        )

    def _split_at(self) -> int:
        if self.context_length is None:
            raise AttributeError("this batch has no context/target split; pass context_length= and target_length=")
        return self.context_length

    @property
    def context(self) -> Segment:
        return self.time_slice(0, self._split_at())

    @property
    def target(self) -> Segment:
        return self.time_slice(self._split_at(), len(self))

    def map(self, fn: Callable[[Any], Any]) -> SegmentBatch:
        out = SegmentBatch.wrap(super().map(fn), self.context_length)
        out.indices, out.weights = self.indices, None if self.weights is None else fn(self.weights)
        return out


def collate(items: Segment | Sequence[Segment]) -> SegmentBatch:
    """A loader's ``collate_fn``: a batch from ``__getitems__`` passes through; single segments are stacked."""
    if isinstance(items, Segment) and items.time_axis == 1:
        return items if isinstance(items, SegmentBatch) else SegmentBatch.wrap(items)
    items = list(cast(Sequence[Segment], items))
    if not items:
        raise ArgumentError("collate needs at least one segment")
    first = items[0]
    meta, meta_mask = _collate_meta(first.schema, items)
    seg = Segment(
        first.schema,
        {k: np.stack([it.data[k] for it in items]) for k in first.data},
        np.stack([it.terminated for it in items]),
        np.stack([it.truncated for it in items]),
        np.stack([it.mask for it in items]),
        meta,
        np.asarray([it.episode_id for it in items], dtype=np.int64),
        np.asarray([it.start for it in items], dtype=np.int64),
        time_axis=1,
        meta_mask=meta_mask,
    )
    return SegmentBatch.wrap(seg)


def _collate_meta(schema: Any, items: list[Segment]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Typed meta arrays and validity masks of single segments (unset values: fill value, mask False)."""
    meta, meta_mask = {}, {}
    for k in items[0].meta.flat():
        column = np.empty(len(items), dtype=object)
        for i, it in enumerate(items):
            column[i] = it.meta.flat()[k] if it.meta_mask.flat()[k] else None
        meta[k], meta_mask[k] = typed_meta(column, schema[k])
    return meta, meta_mask


def unbatch(batch: Segment, i: int) -> Segment:
    """Item ``i`` of a batch as a single Segment (views; meta as Python values, unset ones the fill value)."""
    meta = {k: python_meta(v[i]) for k, v in batch.meta.flat().items()}
    meta_mask = {k: bool(v[i]) for k, v in batch.meta_mask.flat().items()}
    return Segment(
        batch.schema,
        {k: v[i] for k, v in batch.data.items()},
        batch.terminated[i],
        batch.truncated[i],
        batch.mask[i],
        meta,
        int(batch.episode_id[i]),
        int(batch.start[i]),
        meta_mask=meta_mask,
    )


class Transitions:
    """A batch of single transitions (see module docstring). Fields are ``[B, ...]``."""

    def __init__(
        self,
        schema: DatasetSchema,
        buffers: dict[str, Any],
        history: int,
        horizon: int,
        next_at: int,
        indices: np.ndarray | None = None,
        weights: Any = None,
    ) -> None:
        self.schema = schema
        self.buffers = buffers
        self.history = history
        self.horizon = horizon
        self.next_at = next_at  # row of the observation buffers where next_obs starts
        self.indices = indices
        self.weights = weights

    def _role(self, role: str, sel: Any) -> Any:
        role = role_of(role)
        items = {f.name: self.buffers[f.key][sel] for f in self.schema.role_fields(role)}
        return role_value(items, role, self.schema.unwrapped(role))

    def __getitem__(self, key: str) -> Any:
        """A field or view by key, as for segments (:func:`~episodelake.segments.lookup`):
        ``tr["observation/state"]``, ``tr["next_obs"]``, ``tr["meta/task"]``, ``tr["discount"]``."""
        return lookup(self, self.schema, key, {k: v for k, v in self.buffers.items() if "/" not in k})

    def _obs_sel(self, first: int) -> tuple[slice, Any]:
        k = self.history
        return (slice(None), first if k == 1 else slice(first, first + k))

    @property
    def obs(self) -> Any:
        return self._role("observation", self._obs_sel(0))

    @property
    def next_obs(self) -> Any:
        return self._role("observation", self._obs_sel(self.next_at))

    observation = obs
    next_observation = next_obs

    @property
    def action(self) -> Any:
        return self._role("action", (slice(None), 0) if self.horizon == 1 else (slice(None),))

    @property
    def reward(self) -> Any:
        return self._role("reward", (slice(None),))

    @property
    def extra(self) -> Any:
        return self._role("extra", (slice(None),)) if self.schema.role_fields("extra") else RoleView({}, "extra")

    @property
    def meta(self) -> RoleView:
        return RoleView({k[5:]: v for k, v in self.buffers.items() if k.startswith("meta/")}, "meta")

    @property
    def meta_mask(self) -> RoleView:
        """False where an episode's meta value is unset (the value then holds the fill value)."""
        return RoleView({k[10:]: v for k, v in self.buffers.items() if k.startswith("meta_mask/")}, "meta_mask")

    def __getattr__(self, name: str) -> Any:
        # terminated, truncated, discount, n_steps, obs_mask, next_obs_mask, action_mask, episode_id, start
        buffers = self.__dict__.get("buffers", {})
        if name in buffers:
            return buffers[name]
        raise AttributeError(name)

    def __len__(self) -> int:
        return len(self.buffers["terminated"])

    def map(self, fn: Callable[[Any], Any]) -> Transitions:
        """A new batch with ``fn`` applied once to every underlying buffer."""
        return Transitions(
            self.schema,
            {k: fn(v) for k, v in self.buffers.items()},
            self.history,
            self.horizon,
            self.next_at,
            self.indices,
            None if self.weights is None else fn(self.weights),
        )

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(np.shape(v))}" for k, v in self.buffers.items() if "/" in k)
        return f"Transitions({shapes})"
