"""The stream's prefetch thread: batches planned in order and built ahead, a few at once.

A ``threading`` exit hook stops every live :class:`_Prefetcher` before
interpreter shutdown.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..core import lifecycle
from ..core.errors import StreamStoppedError
from .batch import SegmentBatch
from .planner import _Planner

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


lifecycle.on_exit("prefetchers", _stop_all_prefetchers)  # a threading-exit stage: before native destructors
