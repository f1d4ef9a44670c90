"""The stream's prefetch thread: batches planned in order and built ahead, as many at once as latency needs.

A ``threading`` exit hook stops every live :class:`_Prefetcher` before
interpreter shutdown.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from typing import Any

import numpy as np

from ..core import lifecycle
from ..core.errors import StreamStoppedError
from ..storage import fetch
from .batch import SegmentBatch
from .planner import _Planner

_END = object()

MAX_IN_FLIGHT = 32  # batches ahead at most, however slow the object store answers
MAX_BYTES = 1 << 30  # batches ahead beyond ``prefetch`` hold at most this many bytes together
IO_BOUND = 0.25  # request latency below this share of a build's work is not worth more batches in flight
SMOOTHING = 0.3  # weight of the newest build in the average of a build's work
BUILD_THREADS = "episodelake-build"


def in_flight(work: float, latency: float, depth: int, limit: int) -> int:
    """Batches to keep ahead: latency x throughput, at least ``depth``, at most ``limit``.

    ``work`` is the average time a build spends not waiting on object-store
    requests and ``latency`` the least time a build waited on them. A build
    takes ``work + latency``; to turn out a batch every ``work`` seconds,
    ``(work + latency) / work`` builds must be under way, plus one batch
    ready for the consumer. Builds that wait little or never (local
    datasets, a warm cache) keep ``depth``.
    """
    if work <= 0 or latency < IO_BOUND * work:
        return depth
    return max(depth, min(limit, math.ceil(latency / work) + 2))


class _Prefetcher:
    """A background thread keeping batches built ahead, ``depth`` or more, returned in planning order.

    The thread plans every batch in order (so ids and resume states are those
    of a stream without prefetch) and hands each to a pool that builds
    several at once, so the object-store requests of several batches are in
    flight together. How many it keeps ahead adapts: whenever the consumer
    has to wait for the next batch, the target grows to :func:`in_flight` of
    the measured work per build and request latency, bounded by
    :data:`MAX_IN_FLIGHT` and by :data:`MAX_BYTES` of batches (never below
    ``depth``) and by the requests the fetcher keeps in flight
    (:data:`~episodelake.fetch.REQUESTS_IN_FLIGHT`: more batches than those
    carry would only queue). It never shrinks: a consumer slower than the builds never
    waits, so it never grows either. The latency is the least wait of a
    build that sent requests, not the average: with more batches in flight
    the server queues them, and an average would grow with that queue,
    which more batches in flight would lengthen further.

    It references only the planner and the build function, never the stream,
    so dropping the stream stops it. Every live prefetcher is stopped and
    joined by :func:`_stop_all_prefetchers` before the interpreter tears down,
    so no thread is inside a TensorStore read when TensorStore's static
    destructors run (that aborts the process: "terminate called without an
    active exception").
    """

    def __init__(
        self,
        planner: _Planner,
        build: Callable[[np.ndarray], SegmentBatch],
        depth: int,
        limit: int = MAX_IN_FLIGHT,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.depth = depth
        self.target = depth  # batches ahead (built or building) the thread keeps now
        self._limit, self._max_bytes = max(depth, limit), max_bytes
        self._items: deque[Any] = deque()  # (future, state after its ids), then an exception or _END
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._work = 0.0  # smoothed time of a build not waiting on object-store requests
        self._latency = math.inf  # the least wait on object-store requests of a build that sent any
        self._batch_bytes = self._batch_requests = 0  # the most any build took
        self._thread = threading.Thread(
            target=self._run, args=(planner, build), daemon=True, name="episodelake-prefetch"
        )
        _LIVE_PREFETCHERS.add(self)
        self._thread.start()

    def _run(self, planner: _Planner, build: Callable[[np.ndarray], SegmentBatch]) -> None:
        # Leaving the pool waits for every build under way, so no read outlives this thread.
        with ThreadPoolExecutor(self._limit, thread_name_prefix=BUILD_THREADS) as pool:
            while True:
                with self._cond:
                    while not self._stop.is_set() and len(self._items) >= self.target:
                        self._cond.wait()
                    if self._stop.is_set():
                        break
                try:
                    ids = planner.next_ids()
                    item = _END if ids is None else (pool.submit(self._timed, build, ids), planner.state())
                except BaseException as exc:  # handed to the consumer, which re-raises it
                    item = exc
                with self._cond:
                    self._items.append(item)
                    self._cond.notify_all()
                if item is _END or isinstance(item, BaseException):
                    break
            if self._stop.is_set():  # builds not started yet are not needed any more
                pool.shutdown(cancel_futures=True)

    def _timed(self, build: Callable[[np.ndarray], SegmentBatch], ids: np.ndarray) -> SegmentBatch:
        """``build(ids)``, its work and its wait on object-store requests measured."""
        start, (waited_before, sent_before) = time.perf_counter(), fetch.thread_io()
        batch = build(ids)
        waited, sent = fetch.thread_io()
        waited, sent = waited - waited_before, sent - sent_before
        work = time.perf_counter() - start - waited
        nbytes = sum(getattr(v, "nbytes", 0) for v in batch.data.values())  # a transform may return tensors
        with self._cond:
            self._work = work if self._work == 0.0 else (1 - SMOOTHING) * self._work + SMOOTHING * work
            if waited > 0:
                self._latency = min(self._latency, waited)
            self._batch_bytes = max(self._batch_bytes, nbytes)
            self._batch_requests = max(self._batch_requests, sent)
        return batch

    def _grow(self) -> None:
        """The consumer waits: keep as many batches ahead as the measured latency needs (under the lock)."""
        limit = self._limit
        if self._batch_bytes:
            limit = min(limit, self._max_bytes // self._batch_bytes)
        if self._batch_requests:
            limit = min(limit, fetch.REQUESTS_IN_FLIGHT // self._batch_requests)
        latency = 0.0 if math.isinf(self._latency) else self._latency
        wanted = in_flight(self._work, latency, self.depth, max(self.depth, limit))
        if wanted > self.target:
            self.target = wanted
            self._cond.notify_all()

    def get(self) -> Any:
        """The next item: ``(batch, state)``, an exception to raise, or ``_END``.

        Raises :class:`StreamStoppedError` once stopped (never blocks then).
        """
        head: Any = None
        with self._cond:
            while head is None:
                if self._stop.is_set():
                    raise StreamStoppedError("the stream's prefetch thread was stopped (interpreter exit)")
                if self._items:
                    head = self._items[0]
                else:
                    self._grow()
                    self._cond.wait(0.1)
        if isinstance(head, tuple):
            future: Future = head[0]
            if not future.done():
                with self._cond:
                    self._grow()
            while not wait_for([future], timeout=0.1).done or future.cancelled():
                if self._stop.is_set():
                    raise StreamStoppedError("the stream's prefetch thread was stopped (interpreter exit)")
        with self._cond:
            self._items.popleft()
            self._cond.notify_all()
        if not isinstance(head, tuple):
            return head
        error = head[0].exception()
        if error is not None:
            self._stop.set()  # as when planning fails: nothing after a failed batch is built
            with self._cond:
                self._cond.notify_all()
            return error
        return head[0].result(), head[1]

    def stop(self) -> None:
        """Stop the thread and wait until it ended (builds under way complete first)."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        _LIVE_PREFETCHERS.discard(self)
        me = threading.current_thread()
        # never from its own threads (a collection run there): the thread ends by itself once its builds do
        if me is not self._thread and not me.name.startswith(BUILD_THREADS):
            self._thread.join()


_LIVE_PREFETCHERS: weakref.WeakSet[_Prefetcher] = weakref.WeakSet()


def _stop_all_prefetchers() -> None:
    for prefetcher in list(_LIVE_PREFETCHERS):
        prefetcher.stop()


lifecycle.on_exit("prefetchers", _stop_all_prefetchers)  # a threading-exit stage: before native destructors
