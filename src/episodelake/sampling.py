"""Sampling: map-style segments for DataLoaders and the training segment stream.

* :class:`SegmentDataset` (``ds.segments(L)``): ``len``/indexing over every
  valid segment (:mod:`.segment_index`), a batched ``__getitems__`` that turns
  a whole loader batch into one planned read, ``collate``; picklable, so it
  runs in PyTorch ``DataLoader`` workers.
* :class:`SegmentStream` (``ds.segment_stream(...)``): seeded batches, with
  replacement (infinite, the default), without (one shuffled pass) or in
  order (``shuffle=False``: one ordered pass); SQL ``where``/``weights``,
  ``filter`` callables, custom samplers, rank/world-size shards, background
  prefetch and exact resume through ``state_dict()``.

Batches are :class:`SegmentBatch` (a :class:`~episodelake.segments.Segment`
with ``time_axis=1``): observation fields hold ``[B, L + 1, ...]`` (``obs``
and ``next_obs`` are views), other fields ``[B, L, ...]``, flags and ``mask``
``[B, L]``, ``meta`` values, ``episode_id`` and ``start`` ``[B]``. Slot ``t``
of item ``b`` holds transition ``start[b] + t`` of its episode (``start`` is
negative for a prefix-padded short episode). Padding slots are zeros with
``mask`` False; in the ``L + 1`` observation buffer the rows outside the
episode's ``T + 1`` observations are zeros, so ``obs``/``next_obs`` at the one
padding slot adjacent to the real run show the neighbouring real observation.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .batching import WindowReader
from .errors import ValidationError
from .segment_index import SegmentIndex, check_positive
from .segments import Segment
from .snapshot import Snapshot

STATE_FORMAT = 1
_READER_LOCK = threading.Lock()


def reader_for(snap: Snapshot) -> WindowReader:
    """The snapshot's :class:`WindowReader`, built once and kept on the snapshot."""
    with _READER_LOCK:
        reader = snap.__dict__.get("_window_reader")
        if reader is None:
            reader = snap.__dict__["_window_reader"] = WindowReader(snap)
        return reader


def select(
    collection: Any, where: str | None = None, filter: Callable[[Any], bool] | None = None
) -> tuple[Snapshot, np.ndarray]:
    """``collection`` narrowed by a SQL predicate and/or a per-episode predicate.

    ``filter`` receives each episode's ``EpisodeRef`` (``episode_id``,
    ``length``, ``terminated``, ``truncated``, ``meta``) and returns a bool.
    Returns ``(snapshot, positions)``.
    """
    if where is not None:
        collection = collection.where(where)
    snap = collection.snapshot()
    positions = np.asarray(collection.positions, dtype=np.int64)
    if filter is not None:
        if not callable(filter):
            raise ValidationError(f"filter must be callable, got {type(filter).__name__}")
        keep = np.fromiter((bool(filter(ref)) for ref in collection.episodes()), bool, len(positions))
        positions = positions[keep]
    return snap, positions


def episode_weights(collection: Any, snap: Snapshot, positions: np.ndarray, weights: Any) -> np.ndarray:
    """Per-episode sampling weights aligned with ``positions``.

    ``weights`` is a SQL expression over the ``episodes`` view (``"return"``,
    ``"CASE WHEN success THEN 4 ELSE 1 END"``), a SQL query returning
    ``episode_id`` and ``weight`` columns (episodes it omits get weight 0),
    or one number per episode of ``collection`` (before any ``where``/``filter``).
    """
    if not isinstance(weights, str):
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(collection.positions),):
            raise ValidationError(
                f"weights: expected one value per episode ({len(collection.positions)}), got shape {w.shape}"
            )
        by_pos = dict(zip(collection.positions.tolist(), w.tolist(), strict=True))
        return np.array([by_pos[p] for p in positions.tolist()], dtype=np.float64)
    text = weights.strip()
    if text.split(None, 1)[0].lower() in ("select", "with", "from"):
        query = text
    else:
        query = f"SELECT episode_id, CAST(({text}) AS DOUBLE) AS weight FROM episodes"
    cols = collection.sql_numpy(query)
    if "episode_id" not in cols or "weight" not in cols:
        raise ValidationError(f"weights query must return episode_id and weight columns, got {sorted(cols)}")
    by_id = dict(zip(cols["episode_id"].tolist(), cols["weight"].tolist(), strict=True))
    ids = snap.index["episode_id"][positions].tolist()
    return np.array([np.nan if by_id.get(i, 0.0) is None else by_id.get(i, 0.0) for i in ids], dtype=np.float64)


class SegmentBatch(Segment):
    """A batch of segments; ``context``/``target`` split it at ``context_length`` transitions.

    ``context`` covers transitions ``[0, C)`` and ``target`` ``[C, L)``; both
    are views of the same buffers, so the observation row ``C`` is the last
    ``next_obs`` of the context and the first ``obs`` of the target.
    """

    context_length: int | None = None

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
        obs = {f.key for f in self.schema.role_fields("observation")}
        data = {k: self._slice(v, slice(start, stop + 1 if k in obs else stop)) for k, v in self.data.items()}
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
        return SegmentBatch.wrap(super().map(fn), self.context_length)


def collate(items: Segment | Sequence[Segment]) -> SegmentBatch:
    """A loader's ``collate_fn``: a batch from ``__getitems__`` passes through; single segments are stacked."""
    if isinstance(items, Segment) and items.time_axis == 1:
        return items if isinstance(items, SegmentBatch) else SegmentBatch.wrap(items)
    items = list(items)
    if not items:
        raise ValidationError("collate needs at least one segment")
    first = items[0]
    meta = {k: np.asarray([it.meta.flat()[k] for it in items]) for k in first.meta.flat()}
    for k, v in meta.items():
        if v.dtype.kind in "OU":
            meta[k] = np.array([it.meta.flat()[k] for it in items], dtype=object)
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
    )
    return SegmentBatch.wrap(seg)


def unbatch(batch: Segment, i: int) -> Segment:
    """Item ``i`` of a batch as a single Segment (views; meta as Python values)."""
    meta = {}
    for k, v in batch.meta.flat().items():
        x = v[i]
        meta[k] = x.item() if isinstance(x, np.generic) else x
    return Segment(
        batch.schema,
        {k: v[i] for k, v in batch.data.items()},
        batch.terminated[i],
        batch.truncated[i],
        batch.mask[i],
        meta,
        int(batch.episode_id[i]),
        int(batch.start[i]),
    )


class SegmentDataset:
    """Every valid segment of a collection, indexable (PyTorch map-style dataset).

    ``dataset[i]`` is one :class:`Segment` (``[L, ...]``); ``__getitems__``
    (used by ``DataLoader`` with a batch size) reads a whole batch with one
    planned read and returns a :class:`SegmentBatch`, which :meth:`collate`
    passes through, so use ``collate_fn=segments.collate``. Picklable: spawn
    workers get the loaded index and small fields; forked workers share them.

    Args:
        collection: a Dataset or DatasetView.
        sequence_length: transitions per segment.
        pad: ``"suffix"`` (default), ``"prefix"`` or None (skip short episodes).
        stride: distance between segment starts within an episode.
        where / filter: narrow the episodes (see :func:`select`).
        shard: ``(rank, world_size)``: this rank's disjoint part of the segments.
    """

    def __init__(
        self,
        collection: Any,
        sequence_length: int,
        pad: str | None = "suffix",
        stride: int = 1,
        where: str | None = None,
        filter: Callable[[Any], bool] | None = None,
        shard: Sequence[int] | None = None,
    ) -> None:
        snap, positions = select(collection, where, filter)
        self.index = SegmentIndex(positions, snap.lengths[positions], sequence_length, pad, stride, shard)
        self.sequence_length = self.index.sequence_length
        self.reader = reader_for(snap)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Segment:
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"segment index must be an int, got {type(i).__name__}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"segment index {i} out of range for {n} segments")
        return unbatch(self.__getitems__([int(i) % n]), 0)

    def __getitems__(self, ids: Sequence[int]) -> SegmentBatch:
        k, first = self.index.locate(np.asarray(ids, dtype=np.int64))
        seg = self.reader.segments(self.index.positions[k], first, self.sequence_length)
        return SegmentBatch.wrap(seg)

    collate = staticmethod(collate)

    def __repr__(self) -> str:
        return f"SegmentDataset({len(self)} segments of {self.sequence_length} transitions)"


class _Planner:
    """Which segment ids each batch holds, and the state to resume from after it."""

    def __init__(
        self,
        index: SegmentIndex,
        batch_size: int,
        mode: str,
        seed: int,
        mass: np.ndarray | None,
        sampler: Any,
        drop_last: bool,
    ) -> None:
        self.index = index
        self.batch_size = batch_size
        self.mode = mode
        self.seed = seed
        self.mass = mass
        self.sampler = sampler
        self.drop_last = drop_last
        self.rng = np.random.default_rng(seed)
        self.cursor = 0
        self.batches = 0
        self._perm: np.ndarray | None = None

    def next_ids(self) -> np.ndarray | None:
        """Ids of the next batch; None at the end of a finite pass."""
        B, n = self.batch_size, len(self.index)
        if self.mode == "random":
            if self.mass is None:
                ids = self.index.sample_uniform(self.rng, B)
            else:
                ids = self.index.sample_weighted(self.rng, B, self.mass)
        elif self.mode == "sampler":
            ids = np.asarray(self.sampler.sample(self.index, B))
            if ids.size == 0:
                return None
        else:
            stop = min(self.cursor + B, n)
            if self.cursor >= n or (self.drop_last and stop - self.cursor < B):
                return None
            if self.mode == "ordered":
                ids = np.arange(self.cursor, stop, dtype=np.int64)
            else:
                if self._perm is None:
                    self._perm = np.random.default_rng(self.seed).permutation(n)
                ids = self._perm[self.cursor : stop]
            self.cursor = stop
        self.batches += 1
        return ids

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "mode": self.mode,
            "seed": self.seed,
            "segments": len(self.index),
            "batches": self.batches,
            "cursor": self.cursor,
            "rng": copy.deepcopy(self.rng.bit_generator.state),
        }
        if self.mode == "sampler" and hasattr(self.sampler, "state_dict"):
            out["sampler"] = copy.deepcopy(self.sampler.state_dict())
        return out

    def load(self, state: dict[str, Any]) -> None:
        for key, want in (("format", STATE_FORMAT), ("mode", self.mode), ("segments", len(self.index))):
            if state.get(key) != want:
                raise ValidationError(f"state_dict: {key} is {state.get(key)!r}, this stream has {want!r}")
        if self.mode == "sampler":
            if "sampler" in state:
                self.sampler.load_state_dict(copy.deepcopy(state["sampler"]))
            elif hasattr(self.sampler, "state_dict"):
                raise ValidationError("state_dict: no sampler state saved, but this stream's sampler has one")
        self.seed = state["seed"]
        self.rng = np.random.default_rng(self.seed)
        self.rng.bit_generator.state = copy.deepcopy(state["rng"])
        self.cursor = int(state["cursor"])
        self.batches = int(state["batches"])
        self._perm = None


_END = object()


class _Prefetcher:
    """A background thread keeping up to ``depth`` built batches ready (bounded queue).

    It references only the planner and the build function, never the stream,
    so dropping the stream stops it.
    """

    def __init__(self, planner: _Planner, build: Callable[[np.ndarray], SegmentBatch], depth: int) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(planner, build), daemon=True, name="episodelake-prefetch"
        )
        self._thread.start()

    def _run(self, planner: _Planner, build: Callable[[np.ndarray], SegmentBatch]) -> None:
        while not self._stop.is_set():
            try:
                ids = planner.next_ids()
                item = _END if ids is None else (build(ids), planner.state())
            except BaseException as exc:  # handed to the consumer, which re-raises it
                item = exc
            self.queue.put(item)
            if item is _END or isinstance(item, BaseException):
                return

    def get(self) -> Any:
        return self.queue.get()

    def stop(self) -> None:
        self._stop.set()
        while self._thread.is_alive():  # unblock a pending put, then let the thread see the flag
            try:
                self.queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)


class SegmentStream:
    """The training stream of segment batches. Iterate it, or call :meth:`sample`.

    Args:
        collection: a Dataset or DatasetView.
        sequence_length: transitions per segment ``L``; or give
            ``context_length`` and ``target_length`` (``L = C + T``) to get
            ``batch.context``/``batch.target``.
        batch_size: segments per batch.
        seed: makes the stream deterministic (None: fresh entropy, recorded in
            ``state_dict()``).
        shuffle / replacement: ``True``/``True`` (default): infinite, uniform
            with replacement. ``True``/``False``: one pass in a seeded random
            order. ``shuffle=False``: one pass in segment order.
        pad, stride: as in :class:`SegmentDataset`.
        where: SQL predicate over ``episodes``; ``filter``: callable on each
            episode's ``EpisodeRef``.
        weights: per-episode sampling weights (a segment's weight is its
            episode's): a SQL expression or query, or an array (see
            :func:`episode_weights`); with-replacement mode only.
        sampler: an object with ``sample(index, batch_size)`` returning
            segment ids in ``[0, len(index))`` (optionally ``state_dict()`` /
            ``load_state_dict()`` for resume; an empty result ends the stream).
        shard: ``(rank, world_size)``: sample only this rank's disjoint share.
        prefetch: batches built ahead by a background thread (0: none).
        drop_last: in finite passes, drop a last batch smaller than ``batch_size``.

    ``state_dict()`` describes the position after the last batch returned
    (not after batches prefetched but not yet returned); a stream built with
    the same arguments resumes exactly with ``load_state_dict()``.
    """

    def __init__(
        self,
        collection: Any,
        sequence_length: int | None = None,
        *,
        context_length: int | None = None,
        target_length: int | None = None,
        batch_size: int = 64,
        seed: int | None = None,
        shuffle: bool = True,
        replacement: bool = True,
        pad: str | None = "suffix",
        stride: int = 1,
        where: str | None = None,
        filter: Callable[[Any], bool] | None = None,
        weights: Any = None,
        sampler: Any = None,
        shard: Sequence[int] | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
    ) -> None:
        if context_length is not None or target_length is not None:
            if context_length is None or target_length is None:
                raise ValidationError("give both context_length and target_length")
            C = check_positive(context_length, "context_length")
            L = C + check_positive(target_length, "target_length")
            if sequence_length is not None and sequence_length != L:
                raise ValidationError(
                    f"sequence_length={sequence_length} disagrees with context_length + target_length = {L}"
                )
        elif sequence_length is None:
            raise ValidationError("give sequence_length, or context_length and target_length")
        else:
            C, L = None, check_positive(sequence_length, "sequence_length")
        self.batch_size = check_positive(batch_size, "batch_size")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValidationError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if sampler is not None and not callable(getattr(sampler, "sample", None)):
            raise ValidationError("sampler must have a sample(index, batch_size) method")
        if weights is not None and (sampler is not None or not (shuffle and replacement)):
            raise ValidationError("weights apply to the default with-replacement sampler only")
        snap, positions = select(collection, where, filter)
        self.index = SegmentIndex(positions, snap.lengths[positions], L, pad, stride, shard)
        self.sequence_length, self.context_length = L, C
        self._build = _BatchBuilder(self.index, reader_for(snap), L, C)
        mass = None
        if weights is not None:
            mass = self.index.episode_weights_table(episode_weights(collection, snap, positions, weights))
        if sampler is not None:
            mode = "sampler"
        elif not shuffle:
            mode = "ordered"
        else:
            mode = "random" if replacement else "permutation"
        if mode == "random" and sampler is None:
            self.index.sample_uniform(np.random.default_rng(0), 0)  # fail now if there is nothing to sample
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 63))
        self._planner = _Planner(self.index, self.batch_size, mode, int(seed), mass, sampler, drop_last)
        self._state = self._planner.state()
        self.prefetch = prefetch
        self._prefetcher: _Prefetcher | None = None
        self._done = False

    @property
    def finite(self) -> bool:
        return self._planner.mode in ("ordered", "permutation")

    def __len__(self) -> int:
        """Batches in one pass (finite streams only)."""
        if not self.finite:
            raise TypeError("an infinite stream has no length")
        n, B = len(self.index), self.batch_size
        return n // B if self._planner.drop_last else -(-n // B)

    def __iter__(self) -> Iterator[SegmentBatch]:
        return self

    def __next__(self) -> SegmentBatch:
        if self._done:
            raise StopIteration
        if self.prefetch == 0:
            ids = self._planner.next_ids()
            item = _END if ids is None else (self._build(ids), self._planner.state())
        else:
            if self._prefetcher is None:
                self._prefetcher = _Prefetcher(self._planner, self._build, self.prefetch)
            item = self._prefetcher.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        batch, self._state = item
        return batch

    def sample(self) -> SegmentBatch:
        """The next batch (``StopIteration`` at the end of a finite pass)."""
        return next(self)

    def state_dict(self) -> dict[str, Any]:
        """The resume point after the last returned batch (plain Python values)."""
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch ``state`` was taken at."""
        self.close()
        self._planner.load(state)
        self._state = self._planner.state()
        self._done = False

    def close(self) -> None:
        """Stop the prefetch thread (the stream can go on; prefetching restarts on demand)."""
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None
            # prefetched batches were consumed by the planner: rewind to what was returned
            self._planner.load(self._state)

    def __enter__(self) -> SegmentStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            prefetcher.stop()

    def __repr__(self) -> str:
        return (
            f"SegmentStream({len(self.index)} segments of {self.sequence_length}, batch_size={self.batch_size}, "
            f"mode={self._planner.mode})"
        )


class _BatchBuilder:
    """What the prefetch thread needs to build batches, without a reference to the stream."""

    def __init__(self, index: SegmentIndex, reader: WindowReader, length: int, context_length: int | None) -> None:
        self.index = index
        self.reader = reader
        self.length = length
        self.context_length = context_length

    def __call__(self, ids: np.ndarray) -> SegmentBatch:
        k, first = self.index.locate(ids)
        return SegmentBatch.wrap(self.reader.segments(self.index.positions[k], first, self.length), self.context_length)


def sample_transitions(collection: Any, batch_size: int, **kwargs: Any):
    """See :func:`episodelake.transitions.sample_transitions`."""
    from .transitions import sample_transitions as impl

    return impl(collection, batch_size, **kwargs)


__all__ = ["SegmentBatch", "SegmentDataset", "SegmentStream", "collate", "sample_transitions"]
