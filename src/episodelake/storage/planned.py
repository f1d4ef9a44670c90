"""The planned reader: Zarr v3 tensor arrays read without TensorStore, many arrays' rows in two fetch rounds.

:class:`PlainArray` reads what :func:`~episodelake.storage.arrays.zarr_metadata`
writes from byte ranges (fsspec, through the read cache), decoded in Python
(:func:`codecs.chunk_decoder`): processes forked from one that used
TensorStore read this way, and so does every process for object stores and
compressed or lossy fields. :func:`read_many` reads row ranges of any
:class:`~episodelake.storage.arrays.ArrayReader`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..core import codecs
from ..core.errors import CorruptionError
from ..core.schema import FieldSpec
from . import layout
from .arrays import NO_CHUNK, ArrayReader, Rows, Run, array_parts, check_layout, read_metadata
from .fetch import Fetcher, Range, fetcher
from .location import Location
from .tensors import TensorArray, fault


class _Ready:
    """An already computed value with a future's ``result()``."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def result(self) -> np.ndarray:
        return self.value


class PlainArray:
    """One of our Zarr v3 arrays read without TensorStore: for processes forked from one that used it.

    Understands exactly what :func:`~episodelake.storage.arrays.zarr_metadata` writes: the ``bytes`` codec,
    optionally ``zstd`` or ``blosc``, or one lossy image per inner chunk,
    optionally inside ``sharding_indexed`` (index at the end), decoded by
    :func:`codecs.chunk_decoder` (compressed chunks in a thread pool). Bytes
    come from plain file reads (local) or concurrent byte-range requests
    through fsspec (object stores; fsspec reopens its connections after
    fork). Reads are synchronous.
    """

    def __init__(
        self, loc: Location, writer: str, field: FieldSpec, commit: int = 0, meta: dict[str, Any] | None = None
    ) -> None:
        self.loc = loc
        self.field = field
        self.commit = commit
        self.dir = loc.child(*array_parts(writer, field, commit))
        self.where = loc.child_url(*array_parts(writer, field, commit))
        self.fetcher = fetcher(loc)
        self.dtype = field.np_dtype.newbyteorder("<")
        try:
            if meta is None:
                meta = read_metadata(loc, writer, field, commit)
            chain = meta["codecs"]
            self.rows = int(meta["shape"][0])
            outer = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise CorruptionError(f"tensor array {self.where} cannot be opened: {exc}") from exc
        check_layout(self.where, meta["shape"], np.dtype(meta["data_type"]), field)
        self.sharded = chain[0]["name"] == "sharding_indexed"
        if self.sharded:
            conf = chain[0]["configuration"]
            chain, self.chunk_rows = conf["codecs"], int(conf["chunk_shape"][0])
            if conf.get("index_location", "end") != "end":
                raise CorruptionError(f"tensor array {self.where}: shard index location {conf['index_location']}")
        else:
            self.chunk_rows = outer
        self.plain = [c.get("name") for c in chain] == ["bytes"]
        try:
            self.decode = codecs.chunk_decoder(chain, (self.chunk_rows, *field.shape), field.np_dtype)
        except ValueError as exc:
            raise CorruptionError(f"tensor array {self.where}: {exc}") from exc
        self.per_shard = outer // self.chunk_rows
        # one-frame chunks (image codecs): the decoded-chunk cache keeps a shard's frames as one entry
        self.by_shard = self.sharded and self.chunk_rows == 1 and not self.plain
        self.run_rows = self.chunk_rows * self.per_shard if self.by_shard else self.chunk_rows  # a run's unit
        # shard -> (per_shard, 2) offsets and sizes; committed shards never change
        self._indexes: dict[int, np.ndarray] = {}
        self._views: dict[int, np.ndarray] = {}  # raw chunks mapped from the disk cache (see _plan)
        self._paths: dict[int, str] = {}  # object path per shard (or chunk, unsharded): one string join each

    @classmethod
    def open_many(cls, loc: Location, arrays: Sequence[tuple[str, int]], field: FieldSpec) -> list[PlainArray]:
        """Several ``(writer, commit)`` arrays of ``field``, their metadata fetched together."""
        paths = [loc.child(*layout.metadata_parts(array_parts(w, field, c))) for w, c in arrays]
        try:
            # a commit array's metadata is written once (cacheable); a writer's single array (commit 0) grows
            blobs = fetcher(loc).read([(p, 0, None) for p in paths], [c > 0 for _, c in arrays])
        except FileNotFoundError as exc:
            raise CorruptionError(f"tensor array cannot be opened: {exc}") from exc
        out = []
        for (writer, commit), path, blob in zip(arrays, paths, blobs, strict=True):
            try:
                meta = json.loads(blob.tobytes())
            except ValueError as exc:
                raise CorruptionError(f"tensor array metadata {path} is not JSON: {exc}") from exc
            out.append(cls(loc, writer, field, commit, meta))
        return out

    def _chunk_path(self, c: int) -> str:
        key = c // self.per_shard if self.sharded else c
        path = self._paths.get(key)
        if path is None:
            if len(self._paths) >= MAX_VIEWS:
                self._paths.clear()
            path = self._paths[key] = "/".join([self.dir, *layout.chunk_parts(key, len(self.field.shape))])
        return path

    def _missing_shards(self, runs: Sequence[Run]) -> list[int]:
        if not self.sharded:
            return []
        S = self.chunk_rows * self.per_shard
        shards = {s for _, src, n, _ in runs for s in range(src // S, (src + n - 1) // S + 1)}
        return sorted(s for s in shards if s not in self._indexes)

    def _index_range(self, shard: int) -> Range:
        size = self.per_shard * 16 + 4  # (offset, nbytes) uint64 pairs, then a CRC-32C
        return (self._chunk_path(shard * self.per_shard), -size, None)

    def _set_index(self, shard: int, blob: np.ndarray) -> None:
        if len(blob) != self.per_shard * 16 + 4:
            raise CorruptionError(f"{self._chunk_path(shard * self.per_shard)}: shard index truncated")
        self._indexes[shard] = blob[:-4].view("<u8").reshape(self.per_shard, 2)

    def _chunk_range(self, c: int, eid: int) -> Range:
        """The stored bytes of inner chunk ``c`` (read for episode ``eid``, named in errors)."""
        path = self._chunk_path(c)
        if not self.sharded:
            return (path, 0, None)
        offset, nbytes = self._indexes[c // self.per_shard][c % self.per_shard].tolist()
        if offset == NO_CHUNK:
            raise CorruptionError(f"{self._what(eid)}: chunk {c} missing from {path}")
        return (path, offset, offset + nbytes)

    def _what(self, eid: int) -> str:
        return f"episode {eid}: field {self.field.key!r}" if eid >= 0 else f"field {self.field.key!r}"

    def _plan(self, runs: Sequence[Run], plan: _Plan) -> None:
        """Add the ranges and copies of ``runs`` to ``plan``.

        Raw rows (the plain ``bytes`` codec) with no cache: only the rows
        used, one range per run and chunk. Otherwise whole inner chunks (the
        unit a cache can reuse), each fetched and decoded once per batch, up
        to the last row the batch needs from it (:attr:`_Plan.upto`: a video
        chunk stops decoding there); raw chunks from the disk cache stay
        mapped (:attr:`_views`) and are read without asking the cache again.
        """
        R, row_bytes = self.chunk_rows, self.field.step_bytes
        rows_only = self.plain and not self.fetcher.caching
        slots: dict[int, int] = {}
        views = self._views
        stats: dict[str, os.stat_result] = {}  # one stat per local file per batch, not per chunk
        for dst, src, n, eid in runs:
            if self.by_shard:
                self._plan_frames(dst, src, n, eid, plan, slots, stats)
                continue
            row, end = src, src + n
            while row < end:
                c, r = divmod(row, R)
                k = min(end - row, R - r)
                at = dst + row - src
                row += k
                view = views.get(c)
                if view is not None:
                    plan.views.append(view)
                    plan.copies.append((self, len(plan.views) - 1, _VIEW, at, r, k, eid, c))
                    continue
                path, start, stop = self._chunk_range(c, eid)
                hit = None if self.plain else codecs.decoded_cache.get(self._decoded_key(path, start, stop, stats))
                if hit is not None and len(hit) >= r + k:  # a video chunk's entry may hold only its first frames
                    plan.views.append(hit)
                    plan.copies.append((self, len(plan.views) - 1, _VIEW, at, r, k, eid, c))
                    continue
                if rows_only:
                    if stop is not None and stop - start != R * row_bytes:
                        raise CorruptionError(f"{self._what(eid)}: chunk {c} of {path} holds {stop - start} bytes")
                    slot = plan.add((path, start + r * row_bytes, start + (r + k) * row_bytes), False)
                    plan.copies.append((self, slot, _ROWS, at, r, k, eid, c))
                else:
                    if c not in slots:
                        slots[c] = plan.add((path, start, stop), True)
                    plan.upto[slots[c]] = max(plan.upto.get(slots[c], 0), r + k)
                    plan.copies.append((self, slots[c], _CHUNK, at, r, k, eid, c))

    def _plan_frames(
        self, dst: int, src: int, n: int, eid: int, plan: _Plan, slots: dict[int, int], stats: dict[str, Any]
    ) -> None:
        """:meth:`_plan` of one run of one-frame chunks: each shard's frames in one copy when all are decoded
        already (its :class:`~episodelake.core.codecs.FrameShard`), else each missing frame fetched and decoded."""
        P, row, end = self.per_shard, src, src + n
        while row < end:
            r = row % P
            k = min(end - row, P - r)
            shard = codecs.decoded_cache.get(self._decoded_key(self._chunk_path(row), None, None, stats))
            if shard is not None and shard.filled[r : r + k].all():
                plan.views.append(shard.frames)
                plan.copies.append((self, len(plan.views) - 1, _VIEW, dst + row - src, r, k, eid, row))
                row += k
                continue
            for c in range(row, row + k):
                at = dst + c - src
                if shard is not None and shard.filled[c % P]:
                    plan.views.append(shard.frames)
                    plan.copies.append((self, len(plan.views) - 1, _VIEW, at, c % P, 1, eid, c))
                    continue
                if c not in slots:
                    slots[c] = plan.add(self._chunk_range(c, eid), True)
                plan.copies.append((self, slots[c], _CHUNK, at, 0, 1, eid, c))
            row += k

    def _decoded_key(
        self, path: str, start: int | None, stop: int | None, stats: dict[str, os.stat_result] | None = None
    ) -> tuple[Any, ...] | None:
        """The decoded-chunk cache key of stored bytes ``[start, stop)`` of ``path`` (``stats``: local files'
        stat results already taken for this batch, filled in).

        Object-store arrays are written once: the range names its bytes. A
        local file may be replaced (the single array's last chunk grows with
        the next commit, vacuum shrinks it): its modification time and size
        join the key, so a replaced file never matches an older entry.
        """
        if not self.loc.is_local:
            return (path, start, stop)
        st = None if stats is None else stats.get(path)
        if st is None:
            try:
                st = os.stat(path)
            except OSError:
                return None  # the read reports it
            if stats is not None:
                stats[path] = st
        return (path, start, stop, st.st_mtime_ns, st.st_size)

    def _keep_view(self, c: int, chunk: np.ndarray) -> None:
        """Keep decoded chunk ``c`` in the decoded-chunk cache (a video chunk's first frames, as many as were
        decoded: the entry's length says which), or raw chunk ``c`` (a view of a disk-cache entry's mapping)
        for later batches."""
        if self.by_shard:
            key = self._decoded_key(self._chunk_path(c), None, None)
            shard = codecs.decoded_cache.get(key)
            if shard is None:
                if self.per_shard * chunk.nbytes > codecs.decoded_cache.limit:
                    return  # the cache could not keep it (EPISODELAKE_DECODED_CACHE_MB=0, or a huge shard)
                shard = codecs.FrameShard(self.per_shard, self.field.shape, chunk.dtype)
                codecs.decoded_cache.put(key, shard)
            shard.frames[c % self.per_shard] = chunk[0]
            shard.filled[c % self.per_shard] = True
        elif not self.plain:
            if chunk.nbytes > codecs.decoded_cache.limit:
                return  # the cache could not keep it: no key to build (a stat of the file)
            key = self._decoded_key(*self._chunk_range(c, -1))
            kept = codecs.decoded_cache.get(key)
            if kept is None or len(kept) < len(chunk):  # never a chunk's first frames over more of them
                codecs.decoded_cache.put(key, chunk)
        elif self.fetcher.disk is not None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            self._views[c] = chunk

    def copy_runs(self, out: np.ndarray, runs: list[Run]) -> None:
        """Copy runs ``(dst row, src row, count, episode id)`` into ``out`` (see :func:`copy_runs_many`)."""
        copy_runs_many([(self, runs)], out)

    def read(self, start: int, stop: int) -> _Ready:
        """Rows ``[start, stop)`` (a ready value with ``result()``)."""
        out = np.empty((stop - start, *self.field.shape), self.field.np_dtype)
        self.copy_runs(out, [(0, start, stop - start, -1)])
        return _Ready(out)


_ROWS, _CHUNK, _VIEW = 0, 1, 2  # a piece's source: fetched rows, a fetched chunk to decode, a kept chunk view
MAX_VIEWS = 4096  # raw disk-cache chunks an array keeps mapped


class _Plan:
    """A batch's byte ranges (with their cache flags) and where each piece goes."""

    def __init__(self) -> None:
        self.ranges: list[Range] = []
        self.cache: list[bool] = []
        self.views: list[np.ndarray] = []
        self.upto: dict[int, int] = {}  # slot of a chunk to decode -> rows of it the batch needs, from its first
        # (array, slot in ranges or views, kind, dst row, first row in the chunk, rows, episode id, chunk)
        self.copies: list[tuple[PlainArray, int, int, int, int, int, int, int]] = []

    def add(self, r: Range, cache: bool) -> int:
        self.ranges.append(r)
        self.cache.append(cache)
        return len(self.ranges) - 1


def copy_runs_many(items: Sequence[tuple[PlainArray, Sequence[Run]]], out: np.ndarray) -> None:
    """Copy every array's runs ``(dst row, src row, count, episode id)`` into ``out`` in two fetch rounds.

    Round one fetches the shard indexes not yet known (kept by each array for
    good: committed shards never change); round two fetches every byte range
    of every array at once, coalesced per object (:class:`~episodelake.storage.fetch.Fetcher`).
    Compressed chunks decode in a thread pool. All arrays must share one location.
    """
    items = [(arr, runs) for arr, runs in items if runs]
    if not items:
        return
    fetch = items[0][0].fetcher
    shards = [(arr, s) for arr, runs in items for s in arr._missing_shards(runs)]
    if shards:
        blobs = _fetch_or_corrupt(fetch, [arr._index_range(s) for arr, s in shards], [True] * len(shards), items)
        for (arr, s), blob in zip(shards, blobs, strict=True):
            arr._set_index(s, blob)
    plan = _Plan()
    for arr, runs in items:
        arr._plan(runs, plan)
    blobs = _fetch_or_corrupt(fetch, plan.ranges, plan.cache, items) if plan.ranges else []
    decoded: dict[int, np.ndarray | ValueError] = {}
    chunks = list({slot: (arr, c) for arr, slot, kind, _, _, _, _, c in plan.copies if kind == _CHUNK}.items())
    if chunks:
        pooled = len(chunks) > 1 and not all(arr.plain for _, (arr, _) in chunks)
        jobs = [(arr, blobs[slot], plan.upto.get(slot)) for slot, (arr, _) in chunks]
        results = (codecs.codec_pool().map if pooled else map)(_decode_or_error, jobs)
        for (slot, (arr, c)), got in zip(chunks, results, strict=True):
            decoded[slot] = got
            if not isinstance(got, ValueError):
                arr._keep_view(c, got)
    for arr, slot, kind, dst, r, k, eid, c in plan.copies:
        if kind == _VIEW:
            out[dst : dst + k] = plan.views[slot][r : r + k]
        elif kind == _ROWS:
            blob = blobs[slot]
            if len(blob) != k * arr.field.step_bytes:
                raise CorruptionError(f"{arr._what(eid)}: chunk {c} of {plan.ranges[slot][0]} is truncated")
            out[dst : dst + k] = blob.view(arr.dtype).reshape(k, *arr.field.shape)
        else:
            got = decoded[slot]
            if isinstance(got, ValueError):
                raise CorruptionError(f"{arr._what(eid)}: chunk {c} of {plan.ranges[slot][0]} {got}") from got
            out[dst : dst + k] = got[r : r + k]


def _decode_or_error(job: tuple[PlainArray, np.ndarray, int | None]) -> np.ndarray | ValueError:
    arr, blob, upto = job
    try:
        return arr.decode(cast(bytes, blob), upto)  # any buffer decodes; the ndarray avoids a copy
    except ValueError as exc:
        return exc


def _fetch_or_corrupt(
    fetch: Fetcher, ranges: list[Range], cache: list[bool], items: Sequence[tuple[PlainArray, Sequence[Run]]]
) -> list[np.ndarray]:
    try:
        return fetch.read(ranges, cache)
    except FileNotFoundError as exc:  # a committed object is gone: name an episode reading from it
        for arr, runs in items:
            if arr.dir in str(exc):
                eid = runs[0][3]
                who = f"episode {eid}: field {arr.field.key!r}" if eid >= 0 else f"field {arr.field.key!r}"
                raise CorruptionError(f"{who}: {exc}") from exc
        raise CorruptionError(str(exc)) from exc


def read_many(requests: Sequence[tuple[ArrayReader, int, int]]) -> list[np.ndarray]:
    """Read several row ranges at once: all reads are issued before any is awaited.

    The :class:`PlainArray` requests of one field are read together, every
    byte range in one fetch round. Every read is awaited even after one
    failed (its ``ValueError`` is raised then), so no read is left in flight
    inside TensorStore.
    """
    for arr, start, stop in requests:
        if stop > arr.rows:
            raise CorruptionError(f"{arr.where}: rows [{start}, {stop}) requested but the array has {arr.rows} rows")
    futures: list[Rows | None] = [None if isinstance(arr, PlainArray) else arr.read(a, b) for arr, a, b in requests]
    planned: dict[str, list[tuple[int, PlainArray, int, int]]] = {}  # field key -> (request, array, start, stop)
    for i, (arr, a, b) in enumerate(requests):
        if isinstance(arr, PlainArray):
            planned.setdefault(arr.field.key, []).append((i, arr, a, b))
    for group in planned.values():
        for (i, _, _, _), value in zip(group, _read_planned([g[1:] for g in group]), strict=True):
            futures[i] = _Ready(value)
    out: list[np.ndarray] = []
    failure: tuple[ValueError, ArrayReader] | None = None
    for (arr, _, _), future in zip(requests, futures, strict=True):
        assert future is not None
        try:
            out.append(future.result())
        except ValueError as exc:
            failure = failure or (exc, arr)
    if failure is not None:
        error, arr = failure
        if isinstance(arr, TensorArray) and arr._loc is not None:
            err = fault(error, arr._loc, arr.where, "reading")
            if err is not error:  # the storage failed, not the data (callers call a ValueError corruption)
                raise err from error
        raise error
    return out


def _read_planned(requests: Sequence[tuple[PlainArray, int, int]]) -> list[np.ndarray]:
    """Row ranges of planned-reader arrays of one field, every byte range fetched in one round."""
    field = requests[0][0].field
    ends = np.cumsum([stop - start for _, start, stop in requests])
    flat = np.empty((int(ends[-1]) if len(ends) else 0, *field.shape), field.np_dtype)
    runs: dict[int, tuple[PlainArray, list[Run]]] = {}
    for (arr, start, stop), end in zip(requests, ends, strict=True):
        runs.setdefault(id(arr), (arr, []))[1].append((int(end) - (stop - start), start, stop - start, -1))
    copy_runs_many(list(runs.values()), flat)
    return np.split(flat, ends[:-1])
