"""Byte ranges of a dataset's immutable objects, fetched together, coalesced and cached.

A :class:`Fetcher` serves :meth:`Fetcher.read`: a list of ``(path, start,
end)`` ranges (``start < 0``: that many bytes from the end, ``end`` None: to
the end) in one call, answered as read-only buffers in the same order.

* Ranges of one object that touch or lie within :data:`MERGE_GAP` bytes of
  each other become one request; every request of a call is in flight at
  once (object stores: TensorStore's key-value store, up to
  :data:`REQUESTS_IN_FLIGHT` concurrent requests per process; in a process
  forked from one that used TensorStore, fsspec's concurrent ``cat_ranges``;
  local files: plain reads).
* Ranges asked for with ``cache=True`` go through the dataset's cache when it
  has one (:class:`~episodelake.diskcache.CacheConfig`): the on-disk cache
  shared by the node's processes, or a per-process memory cache. Only hits
  are served from it; misses are fetched, then stored.
* :attr:`Fetcher.stats` counts requests, bytes received and cache hits;
  :func:`thread_io` the seconds the calling thread spent waiting on
  object-store answers and the requests it sent (the stream's prefetcher
  sizes its batches in flight by them).
* Object-store requests retry and time out as the location's
  :class:`~episodelake.location.StorageTimeouts` say; a request that still
  fails (endpoint down, throttled past its retries, no answer within the
  deadline) raises :class:`~episodelake.errors.StorageError` naming the
  dataset and the object. A missing object stays ``FileNotFoundError``.

One fetcher per location and process (:func:`fetcher`): a forked child builds
its own (TensorStore handles and connections do not cross a fork).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorstore as ts

from ..core import lifecycle
from .diskcache import CacheConfig, DiskCache, MemoryCache
from .engine import engine_usable, start_engine, wait
from .faults import storage_fault
from .location import Location

REQUESTS_IN_FLIGHT = 256  # TensorStore s3 requests in flight per process (its default is 32)
MERGE_GAP = 64 << 10  # ranges of one object closer than this are fetched as one request

Range = tuple[str, int, int | None]


@dataclass
class FetchStats:
    """What a fetcher did: ``requests`` sent, ``bytes`` received, ranges served by its cache (``hits``)."""

    requests: int = 0
    bytes: int = 0
    hits: int = 0


class Fetcher:
    """Reads byte ranges of ``loc``'s objects (see the module docstring)."""

    def __init__(self, loc: Location, cache: CacheConfig | None = None) -> None:
        self.loc = loc
        self.cache = cache
        self.disk = DiskCache(cache.directory, cache.max_bytes) if cache and cache.directory else None
        self.memory = MemoryCache(cache.max_bytes) if cache and not cache.directory and cache.max_bytes else None
        self.stats = FetchStats()
        self._lock = threading.Lock()
        self._kv: ts.KvStore | None = None
        self._root = loc.child().rstrip("/") + "/"

    @property
    def caching(self) -> bool:
        """Whether ranges asked for with ``cache=True`` are kept (then callers ask for reusable units)."""
        return self.disk is not None or self.memory is not None

    def read(self, ranges: Sequence[Range], cache: bool | Sequence[bool] = False) -> list[np.ndarray]:
        """The bytes of each range as a read-only ``uint8`` array; ``FileNotFoundError`` for a missing object.

        ``cache``: whether to go through the cache, for all ranges or per range.
        """
        out: list[np.ndarray | None] = [None] * len(ranges)
        flags = [cache] * len(ranges) if isinstance(cache, bool) else list(cache)
        store = self.disk if self.disk is not None else self.memory
        keys: dict[int, str] = {}
        if store is not None:
            for i, flag in enumerate(flags):
                if flag:
                    keys[i] = self._key(ranges[i])
                    out[i] = store.get(keys[i])
        todo = [i for i, got in enumerate(out) if got is None]
        fetched = self._fetch([ranges[i] for i in todo])
        for i, data in zip(todo, fetched, strict=True):
            out[i] = data
            if store is not None and i in keys:
                store.put(keys[i], data)
        with self._lock:
            self.stats.hits += len(ranges) - len(todo)
        return out  # type: ignore[return-value]

    def _key(self, r: Range) -> str:
        namespace = self.cache.namespace if self.cache else ""
        return f"{self.loc.url}\0{namespace}\0{r[0]}\0{r[1]}\0{r[2]}"

    def _fetch(self, ranges: Sequence[Range]) -> list[np.ndarray]:
        """Fetch ``ranges``, coalesced per object, every request in flight together."""
        if not ranges:
            return []
        order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1]))
        requests: list[list[Any]] = []  # [path, start, end, [(index, offset in the request)]]
        for i in order:
            path, start, end = ranges[i]
            last = requests[-1] if requests else None
            mergeable = start >= 0 and end is not None
            if (
                mergeable
                and last is not None
                and last[0] == path
                and last[2] is not None
                and last[1] >= 0
                and start <= last[2] + MERGE_GAP
            ):
                last[3].append((i, start - last[1]))
                last[2] = max(last[2], end)
            else:
                requests.append([path, start, end, [(i, 0)]])
        blobs = self._get([(p, s, e) for p, s, e, _ in requests])
        with self._lock:
            self.stats.requests += len(requests)
            self.stats.bytes += sum(len(b) for b in blobs)
        out: list[np.ndarray | None] = [None] * len(ranges)
        for (_, _, _, parts), blob in zip(requests, blobs, strict=True):
            whole = np.frombuffer(blob, np.uint8)
            for i, offset in parts:
                _, start, end = ranges[i]
                out[i] = whole[offset:] if end is None else whole[offset : offset + end - start]
        return out  # type: ignore[return-value]

    def _get(self, requests: Sequence[Range]) -> list[bytes]:
        if self.loc.is_local:
            return [_read_file(*r) for r in requests]
        start = time.monotonic()
        try:
            return self._get_remote(requests)
        finally:
            seconds, sent = thread_io()
            _THREAD_IO.totals = (seconds + time.monotonic() - start, sent + len(requests))

    def _get_remote(self, requests: Sequence[Range]) -> list[bytes]:
        if not engine_usable():  # forked from a TensorStore process: fsspec (reconnects after fork)
            paths, starts, ends = zip(*requests, strict=True)
            blobs = self.loc.fs.cat_ranges(list(paths), list(starts), list(ends), on_error="return")
            for path, blob in zip(paths, blobs, strict=True):
                if isinstance(blob, FileNotFoundError):
                    raise FileNotFoundError(f"{path}: {blob}")
                if isinstance(blob, BaseException):
                    raise self._fault(blob, path) from blob
            return list(blobs)
        kv = self._kvstore()
        futures = [kv.read(path[len(self._root) :], byte_range=slice(start, end)) for path, start, end in requests]
        out: list[bytes] = []
        failed: tuple[BaseException, str] | None = None
        nbytes = sum(end - start for _, start, end in requests if end is not None and start >= 0)
        until = time.monotonic() + self.loc.timeouts.transfer_deadline(nbytes)  # one deadline for the round
        for (path, _, _), future in zip(requests, futures, strict=True):
            if failed is not None:  # none is left in flight after a failure
                future.cancel()
                continue
            try:
                result = wait(future, max(0.0, until - time.monotonic()))
            except (ValueError, TimeoutError) as exc:
                failed = (exc, path)
                continue
            if result.state != "value":
                raise FileNotFoundError(f"{self.loc.protocol}://{path} does not exist")
            out.append(result.value)
        if failed is not None:
            raise self._fault(*failed) from failed[0]
        return out

    def _fault(self, exc: BaseException, path: str) -> BaseException:
        """The error a failed read of ``path`` raises: a :class:`StorageError` for storage faults, else ``exc``."""
        err = storage_fault(
            exc,
            dataset=self.loc.url,
            object=f"{self.loc.protocol}://{path}",
            doing="reading",
            endpoint=self.loc.endpoint,
        )
        return exc if err is None else err

    def _kvstore(self) -> ts.KvStore:
        with self._lock:
            if self._kv is None:
                start_engine(self.loc.url)
                self._kv = ts.KvStore.open(self.loc.kvstore(), context=_context()).result()
            return self._kv


_THREAD_IO = threading.local()


def thread_io() -> tuple[float, int]:
    """Running totals of the calling thread: seconds waited on object-store requests, requests sent.

    Local reads count in neither.
    """
    return getattr(_THREAD_IO, "totals", (0.0, 0))


def _read_file(path: str, start: int, end: int | None) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(start, os.SEEK_END if start < 0 else os.SEEK_SET)
        return fh.read() if end is None else fh.read(end - start)


_CONTEXT: ts.Context | None = None


def _context() -> ts.Context:
    """The process's TensorStore context for fetching: many concurrent object-store requests."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = ts.Context({"s3_request_concurrency": {"limit": REQUESTS_IN_FLIGHT}})
    return _CONTEXT


_FETCHERS: dict[tuple[int, str, str, str, CacheConfig | None], Fetcher] = {}
_FETCHERS_LOCK = threading.Lock()


def fetcher(loc: Location) -> Fetcher:
    """The process's :class:`Fetcher` for ``loc`` and its read cache (``loc.read_cache``)."""
    cache = loc.read_cache
    options = json.dumps(loc.storage_options, sort_keys=True, default=str)
    key = (os.getpid(), loc.url, options, repr(loc.timeouts), cache)
    with _FETCHERS_LOCK:
        found = _FETCHERS.get(key)
        if found is None:
            found = _FETCHERS[key] = Fetcher(loc, cache)
        return found


def _reset_after_fork() -> None:
    global _FETCHERS_LOCK
    _FETCHERS_LOCK = threading.Lock()  # a parent thread may have held it at fork time


lifecycle.after_fork("fetchers", _reset_after_fork)
