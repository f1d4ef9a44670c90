"""The training stream of segment batches (``ds.segment_stream(...)``): planner, prefetch thread, resume.

:class:`SegmentStream` yields seeded :class:`~episodelake.batch.SegmentBatch`
batches, with replacement (infinite, the default), without (one shuffled
pass) or in order (``shuffle=False``: one ordered pass); SQL
``where``/``weights``, ``filter`` callables, custom samplers
(:mod:`.samplers`), prioritized replay (``priority=``: :mod:`.priority`),
rank/world-size shards, background prefetch and exact resume through
``state_dict()``.

* :class:`_Planner` decides which global segment ids each batch holds and
  the state to resume from after it; with replacement it draws through a
  :class:`~episodelake.samplers.Sampler` (built in or the user's).
* :class:`_Prefetcher` builds batches ahead on a background thread; a
  ``threading`` exit hook stops every live one before interpreter shutdown.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from ..core.errors import ArgumentError, StreamStoppedError
from ..core.transforms import FrameTransform, Transform, apply_transforms, check_transforms
from ..read.batching import WindowReader, reader_for
from ..read.selection import episode_weights, select
from ..storage.location import public_url
from .batch import SegmentBatch
from .priority import bind, prioritized_sampler
from .samplers import PrioritizedSampler, Sampler, StatefulSampler, UniformSampler, WeightedSampler
from .segment_index import SegmentIndex, check_positive, check_seed

STATE_FORMAT = 2

FINITE_MODES = ("ordered", "permutation")
# where a state keeps its sampler's state: the built-in samplers' generator ("random"), a user sampler's own;
# a prioritized stream's generator ("rng") and, taken when state_dict() is called, its priorities ("priorities")
SAMPLER_STATE = {"random": "rng", "sampler": "sampler"}
SEEDED_MODES = ("permutation", "random", "prioritized")
SHARD_POLICIES = ("wrap", "drop")


class EpisodeDigest:
    """The fingerprint of a collection's ``(episode id, length)`` pairs, extended as episodes are appended.

    A streaming hash of the pairs in order: a collection grown episode by
    episode has the digest of the same collection built at once.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> EpisodeDigest:
        pairs = np.column_stack([np.asarray(ids, np.int64), np.asarray(lengths, np.int64)])
        self._hash.update(np.ascontiguousarray(pairs).tobytes())
        return self

    def hexdigest(self) -> str:
        return self._hash.copy().hexdigest()[:16]


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

    With replacement (mode ``"random"``: a built-in sampler) and with a
    custom sampler (mode ``"sampler"``) each rank draws through the
    :class:`~episodelake.samplers.Sampler` protocol from its own shard of the
    index (:class:`SegmentIndex`); the built-in samplers' generator is seeded by
    ``seed`` (world size 1) or ``(seed, rank)``. That state is per rank.
    Prioritized (mode ``"prioritized"``) draws through a
    :class:`~episodelake.samplers.PrioritizedSampler` and keeps the last
    draw's slots and importance weights in ``drawn``.
    """

    def __init__(
        self,
        index: SegmentIndex,
        batch_size: int,
        mode: str,
        seed: int,
        sampler: Sampler | None,
        drop_last: bool,
        shard_policy: str,
        params: dict[str, Any],
        seed_given: bool,
    ) -> None:
        self.index = index
        self.batch_size = batch_size
        self.mode = mode
        self.sampler = sampler
        self.drop_last = drop_last
        self.shard_policy = shard_policy
        self.params = params
        self.seed_given = seed_given
        self.drawn: tuple[np.ndarray, np.ndarray] | None = None
        self._reset(seed, epoch=0, consumed=0)

    def _reset(self, seed: int, epoch: int, consumed: int) -> None:
        self.seed = seed
        self.params["seed"] = seed
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
        if self.mode == "prioritized":
            local, slots, weights = cast(PrioritizedSampler, self.sampler).draw(B)
            self.drawn = (slots, weights)
            return index.to_global(local)
        if self.sampler is not None:
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
        key = SAMPLER_STATE.get(self.mode)
        if key is not None and self.sampler is not None and hasattr(self.sampler, "state_dict"):
            saved = self.sampler.state_dict()
            # a built-in sampler's generator state is a fresh dict every call: no copy needed (one per batch)
            out[key] = saved if isinstance(self.sampler, UniformSampler) else copy.deepcopy(saved)
        if self.mode == "prioritized":  # the generator only (a fresh dict): priorities are taken by state_dict()
            out["rng"] = cast(PrioritizedSampler, self.sampler).rng.bit_generator.state
        return out

    def check(self, state: dict[str, Any]) -> None:
        """Raise ArgumentError naming the first parameter in which ``state``'s stream differs from this one."""
        if not isinstance(state, dict):
            raise ArgumentError(f"state_dict: expected a dict, got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: format is {state.get('format')!r}, this version reads {STATE_FORMAT}")
        saved, mine = state.get("params") or {}, self.params

        def mismatch(name: str, theirs: Any, ours: Any) -> ArgumentError:
            return ArgumentError(
                f"state_dict: {name} is {theirs!r} in the saved state but {ours!r} in this stream "
                "(a state loads only into a stream over the same segments, sampled the same way)"
            )

        if state.get("mode") != self.mode:
            raise mismatch("mode (shuffle/replacement/sampler)", state.get("mode"), self.mode)
        for key in (
            "sequence_length",
            "pad",
            "stride",
            "segments",
            "episodes",
            "weights",
            "drop_last",
            "alpha",
            "beta",
        ):
            if saved.get(key) != mine[key]:
                raise mismatch(key, saved.get(key), mine[key])
        if self.mode in SEEDED_MODES and self.seed_given and saved.get("seed") != mine["seed"]:
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
                raise ArgumentError(f"state_dict: {key} must be an int >= 0, got {value!r}")
        if self.mode in ("random", "prioritized") and not isinstance(state.get("rng"), dict):
            raise ArgumentError("state_dict: no generator state ('rng') saved")
        if self.mode == "sampler" and "sampler" not in state and hasattr(self.sampler, "state_dict"):
            raise ArgumentError("state_dict: no sampler state saved, but this stream's sampler has one")

    def load(self, state: dict[str, Any]) -> None:
        self.check(state)
        key = SAMPLER_STATE.get(self.mode)
        if key is not None and key in state:
            cast(StatefulSampler, self.sampler).load_state_dict(copy.deepcopy(state[key]))
        if self.mode == "prioritized":
            cast(PrioritizedSampler, self.sampler).rng.bit_generator.state = copy.deepcopy(state["rng"])
        self._reset(int(state["params"]["seed"]), int(state["epoch"]), int(state["consumed"]))
        self.ended = bool(state.get("finished"))


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
        # Batches are planned here in order and built by ``depth`` threads at once, so the object-store reads
        # of several batches are in flight together (latency overlaps); the queue keeps their order. Leaving
        # the pool waits for every build, so no read outlives this thread.
        with ThreadPoolExecutor(max(1, self.queue.maxsize), thread_name_prefix="episodelake-build") as pool:
            while not self._stop.is_set():
                try:
                    ids = planner.next_ids()
                    item = _END if ids is None else (pool.submit(build, ids), planner.state())
                except BaseException as exc:  # handed to the consumer, which re-raises it
                    item = exc
                self.queue.put(item)
                if item is _END or isinstance(item, BaseException):
                    return

    def get(self) -> Any:
        """The next item; raises :class:`StreamStoppedError` once stopped with nothing left (never blocks)."""
        while True:
            try:
                item = self.queue.get(timeout=0.1)
                if isinstance(item, tuple) and isinstance(item[0], Future):
                    error = item[0].exception()
                    if error is not None:
                        self._stop.set()  # as when planning fails: nothing after a failed batch is built
                        return error
                    return item[0].result(), item[1]
                return item
            except queue.Empty:
                if self._stop.is_set() and not self._thread.is_alive():
                    raise StreamStoppedError("the stream's prefetch thread was stopped (interpreter exit)") from None

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
threading._register_atexit(_stop_all_prefetchers)  # type: ignore[attr-defined]


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
        sampler: a :class:`~episodelake.samplers.Sampler`: an object with
            ``sample(index, batch_size)`` returning segment ids in
            ``[0, len(index))`` (optionally ``state_dict()`` /
            ``load_state_dict()`` for resume; an empty result ends the stream).
            A :class:`~episodelake.samplers.PrioritizedSampler` makes the
            stream prioritized, as ``priority=`` does, with that sampler.
        priority: prioritized replay: each segment's starting priority (a
            number, a scalar per-step field key, a SQL expression or query
            over ``episodes``, or an array; see :mod:`episodelake.priority`).
            A segment is drawn with probability ``p ** alpha / sum(p ** alpha)``;
            batches carry ``indices`` and importance ``weights``
            (``(N * P) ** -beta`` over the batch's largest); pass new
            priorities with :meth:`update_priorities`. Each batch is drawn
            when requested, so it sees every update before it (no prefetch).
        alpha, beta: the prioritization and importance exponents (0.6, 0.4).
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
        follow: before each batch, take in the episodes committed since
            (:meth:`refresh`: one check of the table's log when nothing
            changed); streams with replacement on a Dataset only.
        transform: field key -> :class:`~episodelake.transforms.FrameTransform`
            (crop/resize/normalize/layout of camera frames) or a callable on
            the field's batch array, applied as each batch is assembled.

    A finite stream ends each pass with ``StopIteration``; iterating it again
    (``iter(stream)``, a new ``for`` loop) starts the next pass (epoch), in a
    new order for ``replacement=False``.

    ``state_dict()`` describes the position after the last batch returned
    (not after batches prefetched but not yet returned); a stream built with
    the same arguments resumes exactly with ``load_state_dict()``, which
    raises ArgumentError naming the first parameter that differs. A finite
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
        sampler: Sampler | None = None,
        shard: Sequence[int] | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
        shard_policy: str = "wrap",
        priority: Any = None,
        alpha: float | None = None,
        beta: float | None = None,
        follow: bool = False,
        transform: Mapping[str, Transform] | None = None,
    ) -> None:
        if not isinstance(follow, bool):
            raise ArgumentError(f"follow must be a bool, got {follow!r}")
        if context_length is not None or target_length is not None:
            if context_length is None or target_length is None:
                raise ArgumentError("give both context_length and target_length")
            C = check_positive(context_length, "context_length")
            L = C + check_positive(target_length, "target_length")
            if sequence_length is not None and sequence_length != L:
                raise ArgumentError(
                    f"sequence_length={sequence_length} disagrees with context_length + target_length = {L}"
                )
        elif sequence_length is None:
            raise ArgumentError("give sequence_length, or context_length and target_length")
        else:
            C, L = None, check_positive(sequence_length, "sequence_length")
        self.batch_size = check_positive(batch_size, "batch_size")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ArgumentError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if sampler is not None and not callable(getattr(sampler, "sample", None)):
            raise ArgumentError("sampler must have a sample(index, batch_size) method")
        if weights is not None and (sampler is not None or not (shuffle and replacement)):
            raise ArgumentError("weights apply to the default with-replacement sampler only")
        if weights is not None and priority is not None:
            raise ArgumentError("give weights= or priority=, not both")
        given_sampler = sampler
        per = prioritized_sampler(sampler, priority, alpha, beta, None)
        if per is not None and not (shuffle and replacement):
            raise ArgumentError("priority applies to sampling with replacement only (shuffle=True, replacement=True)")
        if shard_policy not in SHARD_POLICIES:
            raise ArgumentError(f"shard_policy must be 'wrap' or 'drop', got {shard_policy!r}")
        check_seed(seed)
        snap, positions = select(collection, where, filter)
        self._source = _Source(collection, where, filter, weights, snap, positions)
        self.index = SegmentIndex(positions, snap.lengths[positions], L, pad, stride, shard)
        self.sequence_length, self.context_length = L, C
        self._build = _BatchBuilder(self.index, reader_for(snap), L, C, check_transforms(snap.schema, transform))
        per_episode = None
        if weights is not None:
            per_episode = episode_weights(collection, snap, positions, weights)
        mass = None if per_episode is None else self.index.episode_weights_table(per_episode)
        if per is not None:
            mode = "prioritized"
        elif sampler is not None:
            mode = "sampler"
        elif not shuffle:
            mode = "ordered"
        else:
            mode = "random" if replacement else "permutation"
        if mode == "permutation" and self.index.world > 1 and seed is None:
            raise ArgumentError(
                "seed: a sharded pass with replacement=False needs an explicit seed, the same on every rank "
                "(each rank must draw the same permutation)"
            )
        seed_given = seed is not None
        if seed is None:
            seed = int(cast(int, np.random.SeedSequence().entropy) % (1 << 63))
        if mode == "random":  # the built-in samplers
            self.index.sample_uniform(np.random.default_rng(0), 0)  # fail now if there is nothing to sample
            rng_seed = seed if self.index.world == 1 else [seed, self.index.rank]
            sampler = UniformSampler(rng_seed) if mass is None else WeightedSampler(rng_seed, mass)
        if per is not None:
            self.index.sample_uniform(np.random.default_rng(0), 0)  # fail now if there is nothing to sample
            if sampler is None:  # the stream's own: seeded like the built-in samplers
                per.rng = np.random.default_rng(seed if self.index.world == 1 else [seed, self.index.rank])
            bind(per, collection, snap, positions, self.index, priority)
            sampler = per
        params = {
            "sequence_length": L,
            "pad": self.index.pad,
            "stride": self.index.stride,
            "segments": self.index.total,
            "episodes": self._source.digest.add(self._source.ids, self.index.lengths).hexdigest(),
            "weights": None if per_episode is None else fingerprint(np.asarray(per_episode, np.float64)),
            "alpha": None if per is None else per.alpha,
            "beta": None if per is None else per.beta,
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
        if follow and self._planner.finite:
            raise ArgumentError("follow=True applies to streams with replacement (shuffle=True, replacement=True)")
        self.follow = follow
        self._arguments = {
            "sequence_length": None if C is not None else L,
            "context_length": C,
            "target_length": None if C is None else L - C,
            "batch_size": self.batch_size,
            "seed": int(seed),
            "shuffle": bool(shuffle),
            "replacement": bool(replacement),
            "pad": pad,
            "stride": stride,
            "where": where,
            "filter": _described(filter),
            "weights": _described(weights),
            "sampler": _described(given_sampler),
            "priority": _described(priority),
            "alpha": alpha,
            "beta": beta,
            "shard": [self.index.rank, self.index.world],
            "shard_policy": shard_policy,
            "drop_last": bool(drop_last),
            "prefetch": prefetch,
            "follow": follow,
            "transform": _transform_lineage(transform),
        }

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
        if self.follow:
            self.refresh()
        item: Any
        if self.prefetch == 0 or self.prioritized:
            ids = self._planner.next_ids()
            item = _END if ids is None else (self._build(ids), self._planner.state())
            if self.prioritized and ids is not None:
                item[0].indices, item[0].weights = cast(tuple[np.ndarray, np.ndarray], self._planner.drawn)
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

    @property
    def prioritized(self) -> bool:
        """Whether batches are drawn by priority (``priority=`` or a PrioritizedSampler)."""
        return self._planner.mode == "prioritized"

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """New priorities for the segments ``indices`` of earlier batches (``batch.indices``).

        See :meth:`PrioritizedSampler.update_priorities`; ArgumentError on a
        stream built without ``priority=``.
        """
        if not self.prioritized:
            raise ArgumentError("update_priorities: this stream was built without priority= or a PrioritizedSampler")
        cast(PrioritizedSampler, self._planner.sampler).update_priorities(indices, priorities)

    @property
    def version(self) -> int:
        """The dataset version whose episodes the stream draws from (moved by :meth:`refresh`)."""
        return self._source.snap.version

    def refresh(self) -> bool:
        """Take in the episodes committed since the stream's version; True if it moved to a newer one.

        The dataset moves to its latest version (``Dataset.refresh()``) and
        the stream goes on from where it is (same generator, same
        priorities) over the new collection. When the new version only
        appended episodes (no delete, eviction or compaction in between) this
        costs ``O(new episodes)``: the segment index, the prioritized tree
        and the fingerprint are extended and new episodes' segments start at
        the largest priority seen; otherwise (or with ``weights=``, which
        are recomputed) the stream rebuilds its index over the whole
        version, keeping each remaining episode's priorities; ``where``
        and ``filter`` are evaluated again over the new version. Given the
        versions it saw, a stream is deterministic: a stream built at the new
        version that loads this one's ``state_dict()`` draws the same batches.
        Streams with replacement (or a sampler) only; a DatasetView is pinned
        and raises ArgumentError.
        """
        source = self._source
        if self._planner.finite:
            raise ArgumentError("refresh applies to streams with replacement (shuffle=True, replacement=True)")
        if not callable(getattr(source.collection, "refresh", None)):
            raise ArgumentError("refresh: this stream reads a pinned view; build it on a Dataset to follow commits")
        snap = source.collection.refresh().snapshot()
        if snap.version == source.snap.version:
            return False
        self.close()  # prefetched batches were planned on the old index
        index, old = self.index, len(self.index.positions)
        snap, positions = select(source.collection, source.where, source.filter)
        ids = np.asarray(snap.index["episode_id"][positions], dtype=np.int64)
        lengths = snap.lengths[positions]
        appended = len(ids) >= old and np.array_equal(ids[:old], source.ids)
        if appended:
            index.extend(positions, lengths[old:])
            source.digest.add(ids[old:], lengths[old:])
        else:
            index.reset(positions, lengths)
            source.digest = EpisodeDigest().add(ids, lengths)
        source.snap, source.positions, source.ids = snap, positions, ids
        self._build.reader = reader_for(snap)
        params = self._planner.params
        params["segments"], params["episodes"] = index.total, source.digest.hexdigest()
        if self.prioritized:
            bind(cast(PrioritizedSampler, self._planner.sampler), source.collection, snap, positions, index, None)
        elif source.weights is not None and isinstance(self._planner.sampler, WeightedSampler):
            per_episode = episode_weights(source.collection, snap, positions, source.weights)
            self._planner.sampler.mass = index.episode_weights_table(per_episode)
            params["weights"] = fingerprint(np.asarray(per_episode, np.float64))
        self._state = self._planner.state()
        return True

    def state_dict(self) -> dict[str, Any]:
        """The resume point after the last returned batch (plain Python values).

        A prioritized stream's state also holds every priority as of this
        call (``"priorities"``: a NumPy array, with ``"max_priority"``);
        ``"version"`` is the dataset version the stream draws from (a stream
        built at that version resumes it exactly).
        """
        state = copy.deepcopy(self._state)
        state["version"] = self.version
        if self.prioritized:
            state.update(cast(PrioritizedSampler, self._planner.sampler).priority_state())
        state["lineage"] = self.lineage()
        return state

    def lineage(self) -> dict[str, Any]:
        """What rebuilds this stream on any node (``el.stream_from_state``): plain JSON values, never credentials.

        ``url`` (the dataset root, no storage options), ``version`` (the
        table version drawn from), ``selection`` (the ``where``/
        ``select_episodes`` steps that made the view the stream reads, with
        their params; ``[]`` for a whole dataset, None when unknown) and
        ``stream`` (every ``segment_stream`` argument, the seed actually
        used, the shard). A callable, array or custom sampler argument that
        cannot travel as JSON is recorded as ``{"given": <kind>}`` and must
        be passed again when rebuilding.
        """
        collection = self._source.collection
        origin = getattr(collection, "_origin", None)
        location = getattr(origin, "location", None)
        selection = getattr(collection, "_selection", None)
        return {
            "url": None if location is None else public_url(location.url),
            "version": self.version,
            "selection": None if selection is None or not _is_json(selection) else [dict(s) for s in selection],
            "stream": dict(self._arguments),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch ``state`` was taken at (ArgumentError if it does not fit).

        A state taken at the end of a pass loads as finished: the next
        ``iter()`` starts the following pass.
        """
        self.close()
        if self.prioritized:  # checked before anything changes
            cast(PrioritizedSampler, self._planner.sampler).check_priority_state(state)
        self._planner.load(state)
        if self.prioritized:
            cast(PrioritizedSampler, self._planner.sampler).load_priority_state(state)
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


def _described(value: Any) -> Any:
    """``value`` if it travels as JSON (None, a number, an SQL string, a field key); else ``{"given": <kind>}``."""
    if isinstance(value, np.ndarray | list | tuple):  # per-episode values: as long as the dataset, never copied
        try:
            return {"given": "array", "fingerprint": fingerprint(np.asarray(value, np.float64))}
        except (TypeError, ValueError):
            return {"given": "array"}
    if value is None or _is_json(value):
        return value
    if callable(value) and not hasattr(value, "sample"):
        return {"given": "callable " + getattr(value, "__qualname__", type(value).__name__)}
    return {"given": type(value).__qualname__}


def _transform_lineage(transform: Mapping[str, Transform] | None) -> Any:
    """``{"frames": {key: FrameTransform fields}}`` when all are FrameTransforms; else ``{"given": "transform"}``."""
    if transform is None:
        return None
    if isinstance(transform, Mapping):
        frames = {key: dataclasses.asdict(t) for key, t in transform.items() if isinstance(t, FrameTransform)}
        if len(frames) == len(transform) and _is_json(frames):
            return {"frames": frames}
    return {"given": "transform"}


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


class _Source:
    """What a stream draws from and how it chose it: enough to choose again at a newer version."""

    def __init__(
        self, collection: Any, where: str | None, filter: Any, weights: Any, snap: Any, positions: np.ndarray
    ) -> None:
        self.collection, self.where, self.filter, self.weights = collection, where, filter, weights
        self.snap, self.positions = snap, positions
        self.ids = np.asarray(snap.index["episode_id"][positions], dtype=np.int64)
        self.digest = EpisodeDigest()


class _BatchBuilder:
    """What the prefetch thread needs to build batches, without a reference to the stream."""

    def __init__(
        self,
        index: SegmentIndex,
        reader: WindowReader,
        length: int,
        context_length: int | None,
        transforms: Mapping[str, Transform],
    ) -> None:
        self.index = index
        self.reader = reader
        self.length = length
        self.context_length = context_length
        self.transforms = transforms

    def __call__(self, ids: np.ndarray) -> SegmentBatch:
        """The batch of global segment ``ids``."""
        k, first = self.index.locate_global(ids)
        seg = self.reader.segments(self.index.positions[k], first, self.length)
        apply_transforms(seg.data, self.reader.schema, self.transforms)
        return SegmentBatch.wrap(seg, self.context_length)
