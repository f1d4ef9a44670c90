"""The training stream of segment batches (``ds.segment_stream(...)``): the stream, its state, the batch builder.

:class:`SegmentStream` yields seeded :class:`~episodelake.batch.SegmentBatch`
batches of a :class:`~episodelake.options.Window`'s segments, chosen by a
``sampler=`` strategy (:mod:`.options`): with replacement (infinite, the
default), in seeded passes or in order; SQL ``where``, ``filter`` callables,
per-episode weights, custom samplers (:mod:`.samplers`), prioritized replay
(:mod:`.priority`), rank/world shards, background prefetch and exact resume
through ``state_dict()``.

* :class:`~episodelake.planner._Planner` decides which global segment ids
  each batch holds and the state to resume from after it.
* :class:`~episodelake.prefetch._Prefetcher` builds batches ahead on
  background threads, as many at once as the object store's latency needs.
* :class:`_BatchBuilder` reads and assembles a batch of segment ids.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np

from ..core.errors import ArgumentError
from ..core.spellings import Refused
from ..core.transforms import FrameTransform, Transform, apply_transforms, check_transforms
from ..read.batching import WindowReader, reader_for
from ..read.collection import EpisodeCollection, selection
from ..read.selection import episode_weights, select
from ..storage.location import public_url
from ..storage.retention import evict_count
from ..write.gate import gated
from .anchors import AnchorIndex, anchor_index
from .batch import SegmentBatch
from .options import (
    KINDS,
    Anchors,
    Prioritized,
    Shard,
    Strategy,
    Weighted,
    Window,
    anchors_of,
    kind_of,
    sampler_of,
    shard_of,
    window_of,
)
from .planner import _Planner
from .prefetch import _END, _Prefetcher
from .priority import bind, prioritized_sampler
from .samplers import PrioritizedSampler, Sampler, UniformSampler, WeightedSampler
from .segment_index import SegmentIndex, check_positive, check_seed

# the planner's mode for each kind of sampler= (a kept PrioritizedSampler, kind "sampler", is "prioritized")
FOLLOW_POLL_S = 0.001
"""How often (seconds) a ``follow=True`` stream looks at the table's log for other handles' commits: a batch
built in ~100 us would otherwise pay the log's file lookups on every call (its own Dataset's episodes are
seen at once, without a look)."""

MODES = {
    "uniform": "random",
    "weighted": "random",
    "passes": "permutation",
    "sequential": "ordered",
    "prioritized": "prioritized",
    "sampler": "sampler",
}


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


class SegmentStream:
    """The training stream of segment batches. Iterate it, or call :meth:`sample`.

    Args:
        collection: a Dataset or DatasetView.
        window: which segments: an :class:`~episodelake.options.Window`
            (length ``L``, or context + target to get
            ``batch.context``/``batch.target``; pad; stride) or an int ``L``.
        batch_size: segments per batch.
        sampler: how segments are chosen (see :mod:`~episodelake.options`):
            ``el.Uniform()`` (None, the default): infinite, uniform with
            replacement; ``el.Uniform(replacement=False)``: finite passes, each
            in a new seeded random order; ``el.Sequential()``: finite passes
            in segment order; ``el.Weighted(weights)``: with replacement, a
            segment as likely as its episode's weight (a SQL expression or
            query, or an array: see :func:`episode_weights`);
            ``el.Prioritized(priority, alpha, beta)``: prioritized replay
            (:mod:`episodelake.priority`): batches carry ``indices`` and
            importance ``weights``, new priorities go to
            :meth:`update_priorities`, and each batch is drawn when requested,
            so it sees every update before it (no prefetch). Or a
            :class:`~episodelake.samplers.Sampler`: an object with
            ``sample(index, batch_size)`` returning segment ids in
            ``[0, len(index))`` (optionally ``state_dict()`` /
            ``load_state_dict()`` for resume; an empty result ends the
            stream); a :class:`~episodelake.samplers.PrioritizedSampler` makes
            the stream prioritized with that sampler.
        seed: makes the stream deterministic (None: fresh entropy, recorded in
            ``state_dict()``).
        where: SQL predicate over ``episodes``; ``filter``: callable on each
            episode's ``EpisodeRef``.
        shard: ``(rank, world)`` or an :class:`~episodelake.options.Shard`.
            Finite passes deal the pass's global segment sequence round-robin
            over the ranks, and every rank yields the same number of batches
            (the shard's ``policy``: ``"wrap"`` or ``"drop"``); with
            replacement or a sampler each rank samples its own disjoint share
            of the index.
        prefetch: batches kept built ahead by background threads, several
            built at once (0: none, each batch is built by the call that
            returns it). While the consumer waits on batches whose builds
            wait on object-store requests, more are kept in flight: the
            measured latency times the build rate, up to 32 batches and
            1 GiB of them (:func:`~episodelake.prefetch.in_flight`); local
            reads keep ``prefetch``. Batches and resume states are those of
            ``prefetch=0`` whatever the number. Without tensor fields (every
            step field in the table) batches are gathered from memory and
            always built inline.
        drop_last: in finite passes, drop a last batch smaller than ``batch_size``.
        follow: before each batch, take in the episodes committed since
            (:meth:`refresh`: one check of the table's log when nothing
            changed, at most every :data:`FOLLOW_POLL_S` for other handles'
            commits); streams with replacement on a Dataset only.
        transform: field key -> :class:`~episodelake.transforms.FrameTransform`
            (crop/resize/normalize/layout of camera frames) or a callable on
            the field's batch array, applied as each batch is assembled.
        anchors: an :class:`~episodelake.options.Anchors`: the segments are
            the ones positioned on the steps its predicate picks (one per
            anchor, starting ``offset`` transitions from it; see
            :mod:`~episodelake.anchors`) instead of every window start: a
            finite pass yields one segment per anchor, draws with replacement
            take anchors uniformly or by the anchors' ``weights`` (times
            ``el.Weighted``'s per-episode weights). ``follow=True`` finds the
            anchors of new episodes at each refresh.

    A finite stream ends each pass with ``StopIteration``; iterating it again
    (``iter(stream)``, a new ``for`` loop) starts the next pass (epoch), in a
    new order for ``el.Uniform(replacement=False)``.

    ``state_dict()`` describes the position after the last batch returned
    (not after batches prefetched but not yet returned); a stream built with
    the same arguments resumes exactly with ``load_state_dict()``, which
    raises ArgumentError naming the first parameter that differs. A finite
    pass's state counts the global positions consumed, so it loads on any
    rank and, at the same global batch size ``batch_size * world``, on a
    different world size: rank ``r`` of the new world continues from that
    global position.
    """

    # episodata's stream members: refused with what to write instead (:mod:`episodelake.core.spellings`)
    sample_transitions, segment_length, read_chunk_size = (Refused("SegmentStream") for _ in range(3))

    def __init__(
        self,
        collection: EpisodeCollection,
        window: Window | int,
        *,
        batch_size: int = 64,
        sampler: Strategy | Sampler | None = None,
        seed: int | None = None,
        where: str | None = None,
        filter: Callable[[Any], bool] | None = None,
        shard: Shard | Sequence[int] | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
        follow: bool = False,
        transform: Mapping[str, Transform] | None = None,
        anchors: Anchors | None = None,
    ) -> None:
        anchors = anchors_of(anchors)
        if not isinstance(follow, bool):
            raise ArgumentError(f"follow must be a bool, got {follow!r}")
        win = window_of(window)
        L, C = win.size, win.context
        self.batch_size = check_positive(batch_size, "batch_size")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ArgumentError(f"prefetch must be an int >= 0, got {prefetch!r}")
        strategy = sampler_of(sampler, "segment_stream", tuple(KINDS))
        kind = kind_of(strategy)
        part = shard_of(shard) or Shard(0, 1)
        check_seed(seed)
        per = prioritized_sampler(strategy, None)
        weights = strategy.weights if isinstance(strategy, Weighted) else None
        snap, positions = select(collection, where, filter)
        self._source = _Source(collection, where, filter, weights, snap, positions)
        rank_world = (part.rank, part.world)
        if anchors is None:
            self.index = SegmentIndex(positions, snap.lengths[positions], L, win.pad, win.stride, rank_world)
        else:
            self.index = anchor_index(collection, snap, positions, anchors, win, rank_world)
        self.sequence_length, self.context_length = L, C
        self._build = _BatchBuilder(self.index, reader_for(snap), L, C, check_transforms(snap.schema, transform))
        self._source.reader = self._build.reader
        per_episode = None
        if weights is not None:
            per_episode = episode_weights(collection, snap, positions, weights)
        mass = None if per_episode is None else self.index.episode_weights_table(per_episode)
        mode = "prioritized" if per is not None else MODES[kind]
        if anchors is not None and anchors.weights is not None and mode != "random":
            raise ArgumentError(
                f"anchors: weights apply to draws with replacement (el.Uniform() or el.Weighted), not {KINDS[kind]}"
            )
        if mode == "permutation" and self.index.world > 1 and seed is None:
            raise ArgumentError(
                "seed: a sharded pass with el.Uniform(replacement=False) needs an explicit seed, the same on every "
                "rank (each rank must draw the same permutation)"
            )
        seed_given = seed is not None
        if seed is None:
            seed = int(cast(int, np.random.SeedSequence().entropy) % (1 << 63))
        built = cast(Sampler, strategy) if kind == "sampler" else None  # finite passes draw without one
        if mode == "random":  # the built-in samplers
            self.index.sample_uniform(np.random.default_rng(0), 0)  # fail now if there is nothing to sample
            rng_seed = seed if self.index.world == 1 else [seed, self.index.rank]
            built = UniformSampler(rng_seed) if mass is None else WeightedSampler(rng_seed, mass)
        if per is not None:
            self.index.sample_uniform(np.random.default_rng(0), 0)  # fail now if there is nothing to sample
            if kind == "prioritized":  # the stream's own: seeded like the built-in samplers
                per.rng = np.random.default_rng(seed if self.index.world == 1 else [seed, self.index.rank])
            bind(per, collection, snap, positions, self.index, per.priority)
            built = per
        params = {
            "sequence_length": L,
            "pad": self.index.pad,
            "stride": self.index.stride,
            "segments": self.index.total,
            "episodes": self._source.digest.add(self._source.ids, self.index.lengths).hexdigest(),
            "weights": None if per_episode is None else fingerprint(np.asarray(per_episode, np.float64)),
            "anchors": _anchor_params(self.index),
            "alpha": None if per is None else per.alpha,
            "beta": None if per is None else per.beta,
            "drop_last": bool(drop_last),
            "shard_policy": part.policy,
            "batch_size": self.batch_size,
            "rank": self.index.rank,
            "world": self.index.world,
        }
        self._planner = _Planner(
            self.index,
            self.batch_size,
            mode,
            int(seed),
            built,
            bool(drop_last),
            part.policy,
            params,
            seed_given,
        )
        self._state: dict[str, Any] | None = self._planner.state()
        self.prefetch = prefetch
        # every step field lives in the table: a batch is a NumPy gather from memory that a thread cannot
        # overlap under the GIL (a prefetch thread made the online loop slower), so it is built inline
        self._in_memory = not snap.schema.tensor_fields
        self._prefetcher: _Prefetcher | None = None
        self._done = False
        if follow and self._planner.finite:
            raise ArgumentError("follow=True applies to streams with replacement (not finite passes)")
        self.follow = follow
        # the lineage record keeps 0.3's keys (lineage.py rebuilds the option objects from them)
        prioritized = strategy if isinstance(strategy, Prioritized) else None
        self._arguments = {
            "sequence_length": None if C is not None else L,
            "context_length": C,
            "target_length": None if C is None else L - C,
            "batch_size": self.batch_size,
            "seed": int(seed),
            "shuffle": kind != "sequential",
            "replacement": kind != "passes",
            "pad": win.pad,
            "stride": win.stride,
            "where": where,
            "filter": _described(filter),
            "weights": _described(weights),
            "sampler": _described(None if kind != "sampler" else strategy),
            "priority": None if prioritized is None else _described(prioritized.priority),
            "alpha": None if prioritized is None else prioritized.alpha,
            "beta": None if prioritized is None else prioritized.beta,
            "shard": [self.index.rank, self.index.world],
            "shard_policy": part.policy,
            "drop_last": bool(drop_last),
            "prefetch": prefetch,
            "follow": follow,
            "transform": _transform_lineage(transform),
        }
        if anchors is not None:  # a key of its own only then: other streams keep 0.3's record
            self._arguments["anchors"] = anchors.record()

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
            self._refresh(FOLLOW_POLL_S)
        item: Any
        if self.prefetch == 0 or self.prioritized or self._in_memory:
            ids = self._planner.next_ids()
            # built inline, the planner stays at the returned batch: its state is taken when asked for
            item = _END if ids is None else (self._build(ids), None)
            if self.prioritized and ids is not None:
                item[0].indices, item[0].weights = cast(tuple[np.ndarray, np.ndarray], self._planner.drawn)
        else:
            if self._prefetcher is None:
                self._state = self._resume_point()
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
        """Whether batches are drawn by priority (``el.Prioritized`` or a PrioritizedSampler)."""
        return self._planner.mode == "prioritized"

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """New priorities for the segments ``indices`` of earlier batches (``batch.indices``).

        See :meth:`PrioritizedSampler.update_priorities`; ArgumentError on a
        stream built without ``el.Prioritized`` or a PrioritizedSampler.
        """
        if not self.prioritized:
            raise ArgumentError(
                "update_priorities: this stream was built without el.Prioritized or a PrioritizedSampler"
            )
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
        return self._refresh(0.0)

    def _refresh(self, min_interval: float) -> bool:
        """:meth:`refresh`, looking at the log for other handles' commits at most every ``min_interval`` s."""
        source = self._source
        if self._planner.finite:
            raise ArgumentError("refresh applies to streams with replacement (not finite passes)")
        if not callable(getattr(source.collection, "refresh", None)):
            raise ArgumentError("refresh: this stream reads a pinned view; build it on a Dataset to follow commits")
        followed = self._writer_followed(min_interval)
        if followed is not None:
            return self._take_pending(*followed)
        follow = getattr(source.collection, "_follow", None)
        snap = (source.collection.refresh() if follow is None else follow(min_interval)).snapshot()
        if snap.version == source.snap.version:
            return False
        self.close()  # prefetched batches were planned on the old index
        index, old = self.index, len(self.index.positions)
        snap, positions = select(source.collection, source.where, source.filter)
        if isinstance(index, AnchorIndex):  # the new episodes' anchors are found in the new version
            index.snap = snap
        self._take(snap, reader_for(snap), positions, snap.lengths[positions], old)
        index = self.index
        params = self._planner.params
        params["anchors"] = _anchor_params(index)
        if self.prioritized:
            bind(cast(PrioritizedSampler, self._planner.sampler), source.collection, snap, positions, index, None)
        elif source.weights is not None and isinstance(self._planner.sampler, WeightedSampler):
            per_episode = episode_weights(source.collection, snap, positions, source.weights)
            self._planner.sampler.mass = index.episode_weights_table(per_episode)
            params["weights"] = fingerprint(np.asarray(per_episode, np.float64))
        self._state = self._planner.state()
        return True

    def _writer_followed(self, min_interval: float) -> tuple[Any, Any] | None:
        """``(snapshot, writer)`` when :meth:`refresh` samples the Dataset's uncommitted episodes without a commit.

        That is a plain uniform stream (no ``where``, ``filter``, weights,
        anchors or priorities) over a Dataset whose step fields all live in
        the table, with no derived columns and no quality gate (whose
        quarantine a commit decides); None otherwise: refresh commits them
        first (read-your-writes) and reads the new version.
        """
        source = self._source
        unflushed = getattr(source.collection, "_unflushed", None)
        if unflushed is None or not self._in_memory or source.snap.derived.fields:
            return None
        if source.where is not None or source.filter is not None or source.weights is not None:
            return None
        if type(self._planner.sampler) is not UniformSampler or isinstance(self.index, AnchorIndex):
            return None
        snap, sink = unflushed(min_interval)
        if sink is None:
            return snap, None
        key = (snap.version, sink.schema)  # a gate changes with a commit (stored checks) or a schema
        if source.gate[0] != key:
            source.gate = (key, gated(sink.store) or sink.schema is not snap.schema)
        return None if source.gate[1] else (snap, sink)

    def _take_pending(self, snap: Any, sink: Any) -> bool:
        """Move to ``snap`` followed by ``sink``'s finished, uncommitted episodes; True if anything changed.

        Only episodes queued since the last call are read (their rows are
        appended to the stream's reader). With a capacity, the oldest
        episodes the pending ones' commit will evict are left out at once,
        as that commit's FIFO plan leaves them out (:func:`evict_count`).
        """
        source = self._source
        same_base = snap.version == source.snap.version and source.reader is not None
        held = source.generation if same_base else None
        now, pending = (None, None) if sink is None else sink.preview(held)
        now = None if now is None or not now[1] else now  # no pending episodes: the snapshot alone
        if same_base and now == source.generation:
            return False
        self.close()  # prefetched batches were planned on the old index
        grows = same_base and (held is None or (now is not None and now[0] == held[0]))
        reader = source.reader if grows and source.reader is not None else reader_for(snap)
        if pending is not None:
            reader = reader.followed_by(*pending)
        positions = np.arange(len(reader.lengths), dtype=np.int64)
        capacity = None if sink is None else sink.store.capacity
        if capacity is not None and len(positions) > snap.num_episodes:
            positions = positions[evict_count(reader.lengths, capacity) :]
        self._take(snap, reader, positions, reader.lengths[positions], len(self.index.positions))
        source.reader, source.generation = reader, now
        self._state = self._planner.state()
        return True

    def _take(self, snap: Any, reader: WindowReader, positions: np.ndarray, lengths: np.ndarray, old: int) -> None:
        """Index ``positions`` of ``reader`` (``lengths``): extended when the first ``old`` episodes stay first."""
        source, index = self._source, self.index
        ids = np.asarray(reader.episode_ids[positions], dtype=np.int64)
        if len(ids) >= old and np.array_equal(ids[:old], source.ids):
            index.extend(positions, lengths[old:])
            source.digest.add(ids[old:], lengths[old:])
        else:
            index.reset(positions, lengths)
            source.digest = EpisodeDigest().add(ids, lengths)
        source.snap, source.positions, source.ids = snap, positions, ids
        source.reader, source.generation = reader, None
        self._build.reader = reader
        params = self._planner.params
        params["segments"], params["episodes"] = index.total, source.digest.hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The resume point after the last returned batch (plain Python values).

        A prioritized stream's state also holds every priority as of this
        call (``"priorities"``: a NumPy array, with ``"max_priority"``);
        ``"version"`` is the dataset version the stream draws from (a stream
        built at that version resumes it exactly).
        """
        if self._source.generation is not None and self._source.generation[1]:
            # a state names a committed version: the uncommitted episodes this stream samples are committed first
            self._source.collection.snapshot()
            self.refresh()
        state = copy.deepcopy(self._resume_point())
        state["version"] = self.version
        if self.prioritized:
            state.update(cast(PrioritizedSampler, self._planner.sampler).priority_state())
        state["lineage"] = self.lineage()
        return state

    def _resume_point(self) -> dict[str, Any]:
        """The planner's state after the last returned batch (``_state`` None: the planner is there now)."""
        return self._planner.state() if self._state is None else self._state

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
        chosen = selection(self._source.collection, self._source.snap)
        return {
            "url": public_url(self._source.snap.loc.url),
            "version": self.version,
            "selection": None if chosen is None or not _is_json(chosen) else [dict(s) for s in chosen],
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
            self._planner.load(self._resume_point())

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


def _anchor_params(index: SegmentIndex) -> dict[str, Any] | None:
    """What a saved state records of an anchored stream: the anchors, and a digest of the segments they gave."""
    if not isinstance(index, AnchorIndex):
        return None
    return dict(index.anchors.record(), found=fingerprint(index.episode, index.starts))


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
        # what the stream reads of its Dataset's uncommitted episodes (refresh without a commit):
        self.reader: WindowReader | None = None  # the snapshot's reader, followed by them once read
        self.generation: tuple[int, int] | None = None  # the writer's (generation, pending count) read into it
        self.gate: tuple[Any, bool] = (None, False)  # (version, schema) -> whether that writer's episodes are gated


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
