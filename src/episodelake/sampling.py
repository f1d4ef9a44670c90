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
import hashlib
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .batching import WindowReader
from .errors import ValidationError
from .segment_index import SegmentIndex, check_positive, check_seed
from .segments import Segment, meta_fill
from .snapshot import Snapshot

STATE_FORMAT = 2
_READER_LOCK = threading.Lock()


def _reset_lock_after_fork() -> None:
    global _READER_LOCK
    _READER_LOCK = threading.Lock()  # a parent's prefetch thread may have held it at fork time


os.register_at_fork(after_in_child=_reset_lock_after_fork)


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
        return SegmentBatch.wrap(super().map(fn), self.context_length)


def collate(items: Segment | Sequence[Segment]) -> SegmentBatch:
    """A loader's ``collate_fn``: a batch from ``__getitems__`` passes through; single segments are stacked."""
    if isinstance(items, Segment) and items.time_axis == 1:
        return items if isinstance(items, SegmentBatch) else SegmentBatch.wrap(items)
    items = list(items)
    if not items:
        raise ValidationError("collate needs at least one segment")
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
        values = [it.meta.flat()[k] for it in items]
        valid = np.array([bool(it.meta_mask.flat()[k]) for it in items], dtype=bool)
        dtype = schema[k].np_dtype
        if dtype.kind == "U":
            meta[k] = np.array([v if ok else None for v, ok in zip(values, valid, strict=True)], dtype=object)
        else:
            meta[k] = np.full((len(items), *schema[k].shape), meta_fill(dtype), dtype=dtype)
            if valid.any():
                meta[k][valid] = np.stack([np.asarray(v, dtype) for v, ok in zip(values, valid, strict=True) if ok])
        meta_mask[k] = valid
    return meta, meta_mask


def unbatch(batch: Segment, i: int) -> Segment:
    """Item ``i`` of a batch as a single Segment (views; meta as Python values, unset ones the fill value)."""
    meta = {}
    for k, v in batch.meta.flat().items():
        x = v[i]
        meta[k] = x.item() if isinstance(x, np.generic) else x
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


FINITE_MODES = ("ordered", "permutation")
SHARD_POLICIES = ("wrap", "drop")


def fingerprint(*arrays: np.ndarray) -> str:
    """A short digest of arrays' values: tells two selections (or weightings) apart in a saved state."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


class _Planner:
    """Which global segment ids each batch holds, and the state to resume from after it.

    Finite passes walk a global sequence of the ``N`` segment ids: ``0 .. N - 1``
    (``"ordered"``) or a permutation seeded by ``(seed, epoch)``
    (``"permutation"``). ``consumed`` counts the sequence positions the whole
    world took in this pass; rank ``r`` of world ``w`` deals positions
    round-robin, so its next batch holds positions ``consumed + r + w * j``
    for ``j < b``, where ``b = min(batch_size, ceil((N - consumed) / w))``
    (``"wrap"``: positions ``>= N`` wrap to the start of the sequence) or
    ``floor((N - consumed) / w)`` (``"drop"``). Every rank computes the same
    ``b``, so every rank yields the same number of batches, and after ``k``
    batches exactly positions ``[0, consumed)`` are taken whatever the world
    size: a state resumes on any rank, and on a new world size.

    With replacement (and with a custom sampler) each rank draws from its own
    shard of the index (:class:`SegmentIndex`), with a generator seeded by
    ``seed`` (world size 1) or ``(seed, rank)``; that state is per rank.
    """

    def __init__(
        self,
        index: SegmentIndex,
        batch_size: int,
        mode: str,
        seed: int,
        mass: np.ndarray | None,
        sampler: Any,
        drop_last: bool,
        shard_policy: str,
        params: dict[str, Any],
        seed_given: bool,
    ) -> None:
        self.index = index
        self.batch_size = batch_size
        self.mode = mode
        self.mass = mass
        self.sampler = sampler
        self.drop_last = drop_last
        self.shard_policy = shard_policy
        self.params = params
        self.seed_given = seed_given
        self._reset(seed, epoch=0, consumed=0)

    def _reset(self, seed: int, epoch: int, consumed: int) -> None:
        self.seed = seed
        self.params["seed"] = seed
        self.rng = np.random.default_rng(seed if self.index.world == 1 else [seed, self.index.rank])
        self.epoch = epoch
        self.consumed = consumed
        self.ended = False  # a pass that ended stays ended, even where another world size could go on
        self._perm: np.ndarray | None = None

    @property
    def finite(self) -> bool:
        return self.mode in FINITE_MODES

    def per_rank(self, left: int) -> int:
        """Items each rank takes from ``left`` remaining positions of a pass."""
        w = self.index.world
        return max(-(-left // w) if self.shard_policy == "wrap" else left // w, 0)

    def _next_count(self) -> int:
        b = min(self.batch_size, self.per_rank(self.index.total - self.consumed))
        return 0 if self.drop_last and b < self.batch_size else b

    def pass_finished(self) -> bool:
        return self.finite and (self.ended or self._next_count() == 0)

    def new_pass(self) -> None:
        self.epoch += 1
        self.consumed = 0
        self.ended = False
        self._perm = None

    def next_ids(self) -> np.ndarray | None:
        """Global segment ids of the next batch; None at the end of a finite pass."""
        B, index = self.batch_size, self.index
        if self.mode == "random":
            if self.mass is None:
                local = index.sample_uniform(self.rng, B)
            else:
                local = index.sample_weighted(self.rng, B, self.mass)
            return index.to_global(local)
        if self.mode == "sampler":
            local = np.asarray(self.sampler.sample(index, B))
            return None if local.size == 0 else index.to_global(local)
        b = 0 if self.ended else self._next_count()
        if b == 0:
            self.ended = True
            return None
        N = index.total
        pos = (self.consumed + index.rank + index.world * np.arange(b, dtype=np.int64)) % N
        self.consumed += b * index.world
        if self.mode == "ordered":
            return pos
        if self._perm is None:
            self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(N)
        return self._perm[pos]

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "mode": self.mode,
            "params": dict(self.params),
            "epoch": self.epoch,
            "consumed": self.consumed,
            "finished": self.pass_finished(),
        }
        if self.mode == "random":
            out["rng"] = copy.deepcopy(self.rng.bit_generator.state)
        if self.mode == "sampler" and hasattr(self.sampler, "state_dict"):
            out["sampler"] = copy.deepcopy(self.sampler.state_dict())
        return out

    def check(self, state: dict[str, Any]) -> None:
        """Raise ValidationError naming the first parameter in which ``state``'s stream differs from this one."""
        if not isinstance(state, dict):
            raise ValidationError(f"state_dict: expected a dict, got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValidationError(f"state_dict: format is {state.get('format')!r}, this version reads {STATE_FORMAT}")
        saved, mine = state.get("params") or {}, self.params

        def mismatch(name: str, theirs: Any, ours: Any) -> ValidationError:
            return ValidationError(
                f"state_dict: {name} is {theirs!r} in the saved state but {ours!r} in this stream "
                "(a state loads only into a stream over the same segments, sampled the same way)"
            )

        if state.get("mode") != self.mode:
            raise mismatch("mode (shuffle/replacement/sampler)", state.get("mode"), self.mode)
        for key in ("sequence_length", "pad", "stride", "segments", "episodes", "weights", "drop_last"):
            if saved.get(key) != mine[key]:
                raise mismatch(key, saved.get(key), mine[key])
        if self.mode in ("permutation", "random") and self.seed_given and saved.get("seed") != mine["seed"]:
            raise mismatch("seed", saved.get("seed"), mine["seed"])
        if self.finite:
            if saved.get("shard_policy") != mine["shard_policy"]:
                raise mismatch("shard_policy", saved.get("shard_policy"), mine["shard_policy"])
            theirs = _global_batch(saved)
            ours = mine["batch_size"] * mine["world"]
            if saved.get("world") == mine["world"] and saved.get("batch_size") != mine["batch_size"]:
                raise mismatch("batch_size", saved.get("batch_size"), mine["batch_size"])
            if theirs != ours:
                raise mismatch("global batch size (batch_size * world size)", theirs, ours)
        else:
            for key in ("world", "rank"):
                if saved.get(key) != mine[key]:
                    raise mismatch(
                        f"shard {key} (per-rank state of a stream with replacement or a sampler)",
                        saved.get(key),
                        mine[key],
                    )
            if saved.get("batch_size") != mine["batch_size"]:
                raise mismatch("batch_size", saved.get("batch_size"), mine["batch_size"])
        for key in ("epoch", "consumed"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(f"state_dict: {key} must be an int >= 0, got {value!r}")
        if self.mode == "random" and not isinstance(state.get("rng"), dict):
            raise ValidationError("state_dict: no generator state ('rng') saved")
        if self.mode == "sampler" and "sampler" not in state and hasattr(self.sampler, "state_dict"):
            raise ValidationError("state_dict: no sampler state saved, but this stream's sampler has one")

    def load(self, state: dict[str, Any]) -> None:
        self.check(state)
        if self.mode == "sampler" and "sampler" in state:
            self.sampler.load_state_dict(copy.deepcopy(state["sampler"]))
        self._reset(int(state["params"]["seed"]), int(state["epoch"]), int(state["consumed"]))
        self.ended = bool(state.get("finished"))
        if self.mode == "random":
            self.rng.bit_generator.state = copy.deepcopy(state["rng"])


def _global_batch(params: dict[str, Any]) -> Any:
    try:
        return int(params["batch_size"]) * int(params["world"])
    except (KeyError, TypeError, ValueError):
        return None


_END = object()


class _Prefetcher:
    """A background thread keeping up to ``depth`` built batches ready (bounded queue).

    It references only the planner and the build function, never the stream,
    so dropping the stream stops it. Every live prefetcher is stopped and
    joined by :func:`_stop_all_prefetchers` before the interpreter tears down,
    so no thread is inside a TensorStore read when TensorStore's static
    destructors run (that aborts the process: "terminate called without an
    active exception").
    """

    def __init__(self, planner: _Planner, build: Callable[[np.ndarray], SegmentBatch], depth: int) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(planner, build), daemon=True, name="episodelake-prefetch"
        )
        _LIVE_PREFETCHERS.add(self)
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
        """The next item; raises ``RuntimeError`` once stopped with nothing left (instead of blocking forever)."""
        while True:
            try:
                return self.queue.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set() and not self._thread.is_alive():
                    raise RuntimeError("the stream's prefetch thread was stopped (interpreter exit)") from None

    def stop(self) -> None:
        """Stop the thread and wait until it ended (its current batch read completes first)."""
        self._stop.set()
        _LIVE_PREFETCHERS.discard(self)
        if threading.current_thread() is self._thread:
            return
        while self._thread.is_alive():  # unblock a pending put, then let the thread see the flag
            try:
                self.queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)


_LIVE_PREFETCHERS: weakref.WeakSet[_Prefetcher] = weakref.WeakSet()


def _stop_all_prefetchers() -> None:
    for prefetcher in list(_LIVE_PREFETCHERS):
        prefetcher.stop()


# threading's exit hooks run at the start of interpreter shutdown, before non-daemon
# threads are joined, before atexit callbacks and long before native static destructors.
threading._register_atexit(_stop_all_prefetchers)


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
        shard: ``(rank, world_size)``. Finite passes deal the pass's global
            segment sequence round-robin over the ranks, and every rank yields
            the same number of batches (see ``shard_policy``); with
            replacement or a sampler each rank samples its own disjoint share
            of the index.
        shard_policy: how a finite sharded pass evens out ``N`` segments over
            ``w`` ranks: ``"wrap"`` (default, like
            ``torch.utils.data.DistributedSampler``) repeats the first
            ``ceil(N / w) * w - N`` positions of the pass; ``"drop"`` leaves
            out the last ``N % w``.
        prefetch: batches built ahead by a background thread (0: none).
        drop_last: in finite passes, drop a last batch smaller than ``batch_size``.

    A finite stream ends each pass with ``StopIteration``; iterating it again
    (``iter(stream)``, a new ``for`` loop) starts the next pass (epoch), in a
    new order for ``replacement=False``.

    ``state_dict()`` describes the position after the last batch returned
    (not after batches prefetched but not yet returned); a stream built with
    the same arguments resumes exactly with ``load_state_dict()``, which
    raises ValidationError naming the first parameter that differs. A finite
    pass's state counts the global positions consumed, so it loads on any
    rank and, at the same global batch size ``batch_size * world_size``, on a
    different world size: rank ``r`` of the new world continues from that
    global position.
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
        shard_policy: str = "wrap",
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
        if shard_policy not in SHARD_POLICIES:
            raise ValidationError(f"shard_policy must be 'wrap' or 'drop', got {shard_policy!r}")
        check_seed(seed)
        snap, positions = select(collection, where, filter)
        self.index = SegmentIndex(positions, snap.lengths[positions], L, pad, stride, shard)
        self.sequence_length, self.context_length = L, C
        self._build = _BatchBuilder(self.index, reader_for(snap), L, C)
        per_episode = None
        if weights is not None:
            per_episode = episode_weights(collection, snap, positions, weights)
        mass = None if per_episode is None else self.index.episode_weights_table(per_episode)
        if sampler is not None:
            mode = "sampler"
        elif not shuffle:
            mode = "ordered"
        else:
            mode = "random" if replacement else "permutation"
        if mode == "random":
            self.index.sample_uniform(np.random.default_rng(0), 0)  # fail now if there is nothing to sample
        if mode == "permutation" and self.index.world > 1 and seed is None:
            raise ValidationError(
                "seed: a sharded pass with replacement=False needs an explicit seed, the same on every rank "
                "(each rank must draw the same permutation)"
            )
        seed_given = seed is not None
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 63))
        params = {
            "sequence_length": L,
            "pad": self.index.pad,
            "stride": self.index.stride,
            "segments": self.index.total,
            "episodes": fingerprint(snap.index["episode_id"][positions].astype(np.int64), self.index.lengths),
            "weights": None if per_episode is None else fingerprint(np.asarray(per_episode, np.float64)),
            "drop_last": bool(drop_last),
            "shard_policy": shard_policy,
            "batch_size": self.batch_size,
            "rank": self.index.rank,
            "world": self.index.world,
        }
        self._planner = _Planner(
            self.index,
            self.batch_size,
            mode,
            int(seed),
            mass,
            sampler,
            bool(drop_last),
            shard_policy,
            params,
            seed_given,
        )
        self._state = self._planner.state()
        self.prefetch = prefetch
        self._prefetcher: _Prefetcher | None = None
        self._done = False

    @property
    def finite(self) -> bool:
        return self._planner.finite

    @property
    def epoch(self) -> int:
        """The pass under way (finite streams; 0 for the first)."""
        return self._planner.epoch

    def __len__(self) -> int:
        """Batches this rank yields in one whole pass (finite streams only; the same on every rank)."""
        if not self.finite:
            raise TypeError("an infinite stream has no length")
        n, B = self._planner.per_rank(self.index.total), self.batch_size
        return n // B if self._planner.drop_last else -(-n // B)

    def __iter__(self) -> Iterator[SegmentBatch]:
        """The stream itself; on a finite stream whose pass ended, the next pass starts first."""
        if self._done and self.finite:
            self.close()
            self._planner.new_pass()
            self._state = self._planner.state()
            self._done = False
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
        """Continue exactly after the batch ``state`` was taken at (ValidationError if it does not fit).

        A state taken at the end of a pass loads as finished: the next
        ``iter()`` starts the following pass.
        """
        self.close()
        self._planner.load(state)
        self._state = self._planner.state()
        self._done = self._planner.pass_finished()

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
            f"mode={self._planner.mode}, shard=({self.index.rank}, {self.index.world}))"
        )


class _BatchBuilder:
    """What the prefetch thread needs to build batches, without a reference to the stream."""

    def __init__(self, index: SegmentIndex, reader: WindowReader, length: int, context_length: int | None) -> None:
        self.index = index
        self.reader = reader
        self.length = length
        self.context_length = context_length

    def __call__(self, ids: np.ndarray) -> SegmentBatch:
        """The batch of global segment ``ids``."""
        k, first = self.index.locate_global(ids)
        return SegmentBatch.wrap(self.reader.segments(self.index.positions[k], first, self.length), self.context_length)


def sample_transitions(collection: Any, batch_size: int, **kwargs: Any):
    """See :func:`episodelake.transitions.sample_transitions`."""
    from .transitions import sample_transitions as impl

    return impl(collection, batch_size, **kwargs)


__all__ = ["SegmentBatch", "SegmentDataset", "SegmentStream", "collate", "sample_transitions"]
