"""Zarr v3 tensor arrays written and read through TensorStore.

A writer's rows of a tensor field live in Zarr v3 arrays of shape
``[rows, *field.shape]``, chunked along time only. Codecs and chunk shapes are
always explicit (TensorStore's defaults for an empty resizable array are
one-row chunks).

* Local datasets: one append-only array per writer and field at
  ``tensors/<writer>/<field key>``; each commit appends at the current end.
* Object stores: one array per commit at ``tensors/<writer>/<commit>/<field key>``
  (``commit`` = 1, 2, ... per writer), shaped exactly to the commit's rows and
  written once, its chunks fitted to those rows (:func:`zarr_metadata`
  ``fit``). The sharding codec packs up to :data:`SHARD_CHUNKS` inner
  chunks into one object, so a random segment read is a few byte-range GETs,
  no object is ever rewritten, and no array holds a row nobody wrote.
* Local datasets with a capacity: one array per commit too (unsharded, its
  chunks no longer than the commit), so vacuum reclaims evicted rows by
  deleting whole arrays, never rewriting live ones.

A table reference (``ref/<key>``) is ``commit << 32 | row``: commit 0 is the
writer's single array (every local dataset, and object-store datasets written
by 0.1.0), so references of older datasets keep their meaning.

Tensor rows are always written before the table commit that references them,
so a crash leaves unreferenced rows (or a whole unreferenced commit array) and
never a half episode.

Object-store operations wait as the location's
:class:`~episodelake.location.StorageTimeouts` allow; one that fails for a
storage reason (endpoint down, throttled past its retries, no answer in time)
raises :class:`~episodelake.errors.StorageError` naming the dataset and the
array, never :class:`CorruptionError`.

TensorStore aborts a process that uses it after ``fork()`` from a process that
did. A forked process (a ``DataLoader`` worker, by default on Linux) therefore
reads through :class:`PlainArray`: the same Zarr files decoded in Python
(fsspec for the bytes, :func:`codecs.chunk_decoder`), no TensorStore.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import tensorstore as ts

from ..core import codecs
from ..core.errors import CorruptionError, ValidationError
from ..core.schema import FRAMES_PER_SHARD, FieldSpec
from . import layout
from .engine import engine_usable as engine_usable  # snapshot asks tensors which reader to use
from .engine import start_engine, wait
from .faults import storage_fault
from .fetch import Fetcher, Range, fetcher
from .location import Location

SHARD_CHUNKS = 64  # most inner chunks per shard object on object stores
COMMIT_SHIFT = 32  # ref = commit << COMMIT_SHIFT | row
ROW_MASK = (1 << COMMIT_SHIFT) - 1
_NO_CHUNK = (1 << 64) - 1  # sharding index entry of an inner chunk that was never written


def make_context(durable: bool = False, cache_bytes: int = 0) -> ts.Context:
    """TensorStore context: fsync only when ``durable``; optional chunk cache."""
    spec: dict[str, Any] = {"file_io_sync": durable, "data_copy_concurrency": {"limit": 4}}
    if cache_bytes:
        spec["cache_pool"] = {"total_bytes_limit": int(cache_bytes)}
    return ts.Context(spec)


def fault(exc: BaseException, loc: Location, where: str, doing: str) -> BaseException:
    """What a failed TensorStore operation on ``where`` raises: a :class:`StorageError` for storage faults, else
    ``exc`` (the caller decides whether that is corruption)."""
    err = storage_fault(exc, dataset=loc.url, object=where, doing=doing)
    return exc if err is None else err


def await_op(future: Any, loc: Location, where: str, doing: str, nbytes: int = 0) -> Any:
    """``future``'s result within the location's deadline (local stores: no deadline); storage faults raise
    :class:`StorageError` (see :func:`fault`)."""
    seconds = None if loc.is_local else loc.timeouts.transfer_deadline(nbytes)
    try:
        return future.result() if seconds is None else wait(future, seconds)
    except (ValueError, TimeoutError) as exc:
        raise fault(exc, loc, where, doing) from exc


class Writes:
    """Writes in flight, with a future's ``result()``: waits for all of them within one deadline.

    A storage fault raises :class:`StorageError` naming the array; after a
    failure the remaining writes are cancelled, so none is left in flight.
    """

    def __init__(self, futures: Sequence[Any], loc: Location, where: str, nbytes: int) -> None:
        self.futures = list(futures)
        self.loc, self.where, self.nbytes = loc, where, nbytes

    def result(self) -> None:
        until = None if self.loc.is_local else time.monotonic() + self.loc.timeouts.transfer_deadline(self.nbytes)
        failed: BaseException | None = None
        for f in self.futures:
            if failed is not None:
                f.cancel()
                continue
            try:
                f.result() if until is None else wait(f, max(0.0, until - time.monotonic()))
            except (ValueError, TimeoutError) as exc:
                failed = exc
        if failed is not None:
            raise fault(failed, self.loc, self.where, "writing") from failed


def split_ref(ref: int) -> tuple[int, int]:
    """``(commit, row)`` of a table reference."""
    return int(ref) >> COMMIT_SHIFT, int(ref) & ROW_MASK


def zarr_metadata(field: FieldSpec, sharded: bool, rows: int = 0, fit: bool = False) -> dict[str, Any]:
    """Explicit Zarr v3 metadata for a field's array of ``rows`` rows.

    Sharded arrays (object stores) get shards of at most :data:`SHARD_CHUNKS`
    inner chunks, fewer when the array needs fewer, so a small commit is one
    small object. ``fit`` (an array written once, by one commit): the rows
    are split into the fewest chunks of at most ``rows_per_chunk`` rows, all
    of one length, so the last chunk pads fewer rows than there are chunks
    (a 21-row commit is one 21-row chunk, not a 341-row one). Lossy fields
    (``codec``) are always sharded: one image per inner chunk,
    ``rows_per_chunk`` frames per shard.
    """
    chunk_rows = field.rows_per_chunk
    if fit and rows and not field.lossy:
        chunk_rows = -(-rows // -(-rows // chunk_rows))  # ceil(rows / fewest chunks)
    elif fit:
        chunk_rows = min(chunk_rows, max(1, rows))
    inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if field.np_dtype.itemsize == 1 or field.np_dtype == np.bool_:
        inner = [{"name": "bytes"}]
    inner += codecs.lossless_codecs(field.compression, field.np_dtype.itemsize)
    chunk = [chunk_rows, *field.shape]
    per_shard = min(SHARD_CHUNKS, max(1, -(-rows // chunk_rows))) if rows else SHARD_CHUNKS
    if field.lossy:  # see frames.FrameArray
        assert field.codec is not None and field.quality is not None and field.layout is not None
        inner = [codecs.lossy_codec(field.codec, field.quality, field.layout)]
        if field.codec in codecs.VIDEO:  # one GOP of rows_per_chunk frames per inner chunk
            gop = field.rows_per_chunk
            most = max(1, FRAMES_PER_SHARD // gop)
            per_shard = min(most, max(1, -(-rows // gop))) if fit and rows else most
            sharded, chunk = True, [gop, *field.shape]
        else:  # one image per inner chunk, rows_per_chunk frames per shard
            sharded, per_shard, chunk = True, chunk_rows, [1, *field.shape]
    chain = inner
    if sharded:
        chain = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": chunk,
                    "codecs": inner,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                },
            }
        ]
        chunk = [chunk[0] * per_shard, *field.shape]
    return {
        "shape": [rows, *field.shape],
        "data_type": field.np_dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": chain,
        "fill_value": _fill_value(field.np_dtype),
        "dimension_names": ["t", *(list(field.layout) if field.layout else [None] * len(field.shape))],
    }


def _fill_value(dtype: np.dtype) -> Any:
    if dtype == np.bool_:
        return False
    return [0, 0] if dtype.kind == "c" else 0


def array_parts(writer: str, field: FieldSpec, commit: int = 0) -> tuple[str, ...]:
    """Path parts of a writer's array of ``field``: its single array (commit 0) or one commit's array."""
    return layout.array_parts(writer, field.key, commit)


def array_exists(loc: Location, writer: str, field: FieldSpec, commit: int = 0) -> bool:
    """Whether the array has its metadata file (an array is created with it)."""
    return loc.exists(*layout.metadata_parts(array_parts(writer, field, commit)))


def read_metadata(loc: Location, writer: str, field: FieldSpec, commit: int = 0) -> dict[str, Any]:
    """The array's Zarr v3 metadata as written; ``OSError``/``ValueError`` when missing or not JSON."""
    path = loc.child(*layout.metadata_parts(array_parts(writer, field, commit)))
    if loc.is_local:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    return json.loads(loc.fs.cat_file(path))


def mappable_layout(loc: Location, writer: str, field: FieldSpec) -> tuple[int, int] | None:
    """``(rows, chunk_rows)`` of ``writer``'s single local array of ``field`` when its chunk files hold raw rows.

    Raw rows: the one ``bytes`` codec in native byte order, a regular grid
    chunked along time only, ``/``-separated default chunk keys and a zero
    fill value, so each chunk file (:func:`layout.chunk_parts`) can be
    memory-mapped as ``chunk_rows`` rows in C order. None otherwise, and when
    the metadata cannot be read (opening the array reports that properly).
    """
    try:
        meta = read_metadata(loc, writer, field)
        codecs = meta["codecs"]
        grid = meta["chunk_grid"]
        keys = meta["chunk_key_encoding"]
        chunk = list(grid["configuration"]["chunk_shape"])
        rows = int(meta["shape"][0])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    dt = field.np_dtype
    endian = (codecs[0].get("configuration") or {}).get("endian", "little") if codecs else None
    plain = (
        len(codecs) == 1
        and codecs[0].get("name") == "bytes"
        and (dt.itemsize == 1 or endian == sys.byteorder)
        and grid.get("name") == "regular"
        and chunk[1:] == list(field.shape)
        and keys.get("name") == "default"
        and (keys.get("configuration") or {}).get("separator", "/") == "/"
        and meta.get("data_type") == dt.name
        and meta.get("fill_value") in (0, False)
    )
    return (rows, int(chunk[0])) if plain else None


def tensors_size(loc: Location) -> int:
    """Bytes stored under the tensor directory (every writer's arrays)."""
    root = loc.child(layout.TENSORS)
    return int(loc.fs.du(root)) if loc.fs.exists(root) else 0


def tensor_writers(loc: Location) -> list[str]:
    """Names of the writers with a tensor directory, sorted."""
    root = loc.child(layout.TENSORS)
    if not loc.fs.exists(root):
        return []
    return sorted(d.rstrip("/").rsplit("/", 1)[-1] for d in loc.fs.ls(root, detail=False))


def writer_commits(loc: Location, writer: str) -> list[int]:
    """The commit numbers of ``writer``'s commit arrays (object stores), sorted."""
    names = [d.rstrip("/").rsplit("/", 1)[-1] for d in loc.fs.ls(loc.child(*layout.writer_parts(writer)), detail=False)]
    return sorted(int(n) for n in names if layout.is_commit_dir(n))


def _check_layout(where: str, shape: Sequence[int], dtype: np.dtype, field: FieldSpec) -> None:
    if tuple(shape[1:]) != field.shape or np.dtype(dtype) != field.np_dtype:
        raise CorruptionError(
            f"tensor array {where} has shape {tuple(shape[1:])} / dtype {np.dtype(dtype)}, "
            f"schema says {field.shape} / {field.np_dtype}"
        )


class TensorArray:
    """A writer's rows of one tensor field, written and read through TensorStore.

    For reading, one Zarr array (``store``, ``rows``). For writing (built by
    :meth:`create`), a sequence of reservations: :meth:`reserve` returns the
    reference of the first reserved row, :meth:`write` takes references. On
    local stores every reservation grows the writer's single array; on object
    stores (and per-commit local arrays) each reservation is a new array of
    exactly that many rows.
    """

    def __init__(self, store: ts.TensorStore | None, field: FieldSpec, where: str) -> None:
        self.store = store
        self.field = field
        self.where = where
        self.rows = 0 if store is None else int(store.domain.exclusive_max[0])
        self.commit = 0  # the reservation being written: 0 (single array) or a commit number
        self._loc: Location | None = None
        self._writer = ""
        self._context: ts.Context | None = None

    @classmethod
    def create(
        cls, loc: Location, writer: str, field: FieldSpec, context: ts.Context, per_commit: bool = False
    ) -> TensorArray:
        """The writing side of ``writer``'s rows of ``field``: one array per commit (``per_commit``, always on
        object stores), else its single array, created now."""
        if loc.is_local and not per_commit:
            arr = cls(_create_store(loc, array_parts(writer, field), field, context, sharded=False), field, "")
            arr.where = loc.child_url(*array_parts(writer, field))
        else:
            arr = cls(None, field, loc.child_url(*array_parts(writer, field, 1)))
        arr._loc, arr._writer, arr._context = loc, writer, context
        return arr

    @classmethod
    def open(
        cls,
        loc: Location,
        writer: str,
        field: FieldSpec,
        context: ts.Context,
        read_only: bool = True,
        commit: int = 0,
    ) -> TensorArray:
        """Open one array (``commit`` 0: the writer's single array) for reading (or resizing)."""
        return cls.open_many(loc, [(writer, commit)], field, context, read_only)[0]

    @classmethod
    def open_many(
        cls,
        loc: Location,
        arrays: Sequence[tuple[str, int]],
        field: FieldSpec,
        context: ts.Context,
        read_only: bool = True,
    ) -> list[TensorArray]:
        """Open several ``(writer, commit)`` arrays of ``field`` at once (all opens in flight together)."""
        start_engine(loc.child_url(*array_parts(arrays[0][0], field, arrays[0][1])) if arrays else loc.url)
        futures = []
        for writer, commit in arrays:
            spec: dict[str, Any] = {"driver": "zarr3", "kvstore": loc.kvstore(*array_parts(writer, field, commit))}
            spec["open"] = True
            if read_only:
                spec["fill_missing_data_reads"] = False  # a deleted chunk must fail, not read as zeros
            if not loc.is_local:
                # Object-store arrays are never rewritten once committed, so a cached
                # chunk needs no revalidating GET.
                spec["recheck_cached_data"] = False
            futures.append(ts.open(spec, context=context, read=True, write=not read_only))
        out = []
        for (writer, commit), future in zip(arrays, futures, strict=True):
            where = loc.child_url(*array_parts(writer, field, commit))
            try:
                store = await_op(future, loc, where, "opening")
            except ValueError as exc:
                raise CorruptionError(f"tensor array {where} cannot be opened: {exc}") from exc
            _check_layout(where, store.shape, store.dtype.numpy_dtype, field)
            arr = cls(store, field, where)
            arr.commit, arr._loc = commit, loc
            out.append(arr)
        return out

    @property
    def write_rows(self) -> int:
        """Rows per write unit (a chunk, or a shard on object stores): writes aligned to it never overlap."""
        assert self.store is not None
        shape = self.store.chunk_layout.write_chunk.shape
        assert shape is not None and shape[0] is not None  # our arrays always declare their chunking
        return int(shape[0])

    def reserve(self, rows: int) -> int:
        """Make room for ``rows`` more rows; return the reference of the first of them."""
        if self.store is not None and self.commit == 0:  # the single local array grows in place
            start = self.rows
            assert self._loc is not None
            grown = self.store.resize(
                exclusive_max=[start + rows, *self.field.shape], resize_metadata_only=True, expand_only=True
            )
            self.store = await_op(grown, self._loc, self.where, "growing")
            self.rows = start + rows
            return start
        assert self._loc is not None and self._context is not None
        if rows > ROW_MASK:
            raise ValidationError(f"{self.where}: one commit of {rows} rows exceeds the limit of {ROW_MASK}")
        self.commit += 1
        parts = array_parts(self._writer, self.field, self.commit)
        local = self._loc.is_local
        # written once: chunks fitted to the commit's rows (no padded chunk on object stores either)
        self.store = _create_store(self._loc, parts, self.field, self._context, sharded=not local, rows=rows, fit=True)
        self.where = self._loc.child_url(*parts)
        self.rows = rows
        return self.commit << COMMIT_SHIFT

    def aligned_end(self, start: int, rows: int) -> int:
        """The largest ``n <= rows`` such that writing rows ``[start, start + n)`` ends on a write unit.

        ``start`` is a reference returned by :meth:`reserve`; writes that end
        on write-unit boundaries never share a chunk (shard).
        """
        unit, row = self.write_rows, start & ROW_MASK
        return (row + rows) // unit * unit - row

    def write(self, start: int, values: np.ndarray) -> Writes:
        """Write ``values`` at references ``[start, start + len(values))`` of reserved space (await ``result()``)."""
        assert self.store is not None and self._loc is not None
        row = start & ROW_MASK
        written = self.store[row : row + len(values)].write(values)
        return Writes([written.commit], self._loc, self.where, values.nbytes)

    def append_block(self, block: np.ndarray) -> tuple[int, Writes]:
        """Reserve ``len(block)`` rows and write ``block`` there in one write.

        Returns the first row's reference and the write future; the caller
        must await it before committing rows that reference the data.
        """
        start = self.reserve(len(block))
        return start, self.write(start, block)

    def read(self, start: int, stop: int) -> ts.Future:
        """Rows ``[start, stop)`` of this array (a future)."""
        assert self.store is not None
        return self.store[start:stop].read()

    def copy_runs(self, out: np.ndarray, runs: list[tuple[int, int, int, int]]) -> None:
        """Copy runs ``(dst row, src row, count, episode id)`` into ``out``, every read in one batch.

        Every read is awaited, even after one failed, so no read is left in
        flight inside TensorStore.
        """
        assert self.store is not None
        batch = ts.Batch()
        futures = [self.store[src : src + n].read(batch=batch) for _, src, n, _ in runs]
        batch.submit()
        failed: tuple[int, int, int, ValueError] | None = None
        for (dst, src, n, eid), fut in zip(runs, futures, strict=True):
            try:
                out[dst : dst + n] = fut.result()
            except ValueError as exc:
                failed = failed or (src, n, eid, exc)
        if failed is not None:  # every read has finished: none is left in flight when we raise
            src, n, eid, error = failed
            if self._loc is not None and (err := fault(error, self._loc, self.where, "reading")) is not error:
                raise err from error
            raise CorruptionError(
                f"episode {eid}: field {self.field.key!r} rows [{src}, {src + n}) of {self.where} unreadable: {error}"
            ) from error


def _create_store(
    loc: Location,
    parts: tuple[str, ...],
    field: FieldSpec,
    context: ts.Context,
    sharded: bool,
    rows: int = 0,
    fit: bool = False,
) -> ts.TensorStore:
    where = loc.child_url(*parts)
    start_engine(where)
    spec = {
        "driver": "zarr3",
        "kvstore": loc.kvstore(*parts),
        "metadata": zarr_metadata(field, sharded=sharded, rows=rows, fit=fit),
        "create": True,
        # Every written chunk is stored (even all-zero ones), so a missing chunk is an error on read.
        "store_data_equal_to_fill_value": True,
    }
    try:
        return await_op(ts.open(spec, context=context), loc, where, "creating")
    except ValueError as exc:
        if "ALREADY_EXISTS" not in str(exc):
            raise
    # The metadata PUT landed but its reply was lost, so the retried conditional PUT found it: the array is
    # ours (a writer's arrays are its own, and each attempt takes a new commit number): open it, same metadata.
    return await_op(ts.open({**spec, "open": True}, context=context), loc, where, "creating")


class _Ready:
    """An already computed value with a future's ``result()``."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def result(self) -> np.ndarray:
        return self.value


class PlainArray:
    """One of our Zarr v3 arrays read without TensorStore: for processes forked from one that used it.

    Understands exactly what :func:`zarr_metadata` writes: the ``bytes`` codec,
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
        _check_layout(self.where, meta["shape"], np.dtype(meta["data_type"]), field)
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
        # shard -> (per_shard, 2) offsets and sizes; committed shards never change
        self._indexes: dict[int, np.ndarray] = {}
        self._views: dict[int, np.ndarray] = {}  # raw chunks mapped from the disk cache (see _plan)

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
        return "/".join(
            [self.dir, *layout.chunk_parts(c // self.per_shard if self.sharded else c, len(self.field.shape))]
        )

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
        if offset == _NO_CHUNK:
            raise CorruptionError(f"{self._what(eid)}: chunk {c} missing from {path}")
        return (path, offset, offset + nbytes)

    def _what(self, eid: int) -> str:
        return f"episode {eid}: field {self.field.key!r}" if eid >= 0 else f"field {self.field.key!r}"

    def _plan(self, runs: Sequence[Run], plan: _Plan) -> None:
        """Add the ranges and copies of ``runs`` to ``plan``.

        Raw rows (the plain ``bytes`` codec) with no cache: only the rows
        used, one range per run and chunk. Otherwise whole inner chunks (the
        unit a cache can reuse), each fetched and decoded once per batch; raw
        chunks from the disk cache stay mapped (:attr:`_views`) and are read
        without asking the cache again.
        """
        R, row_bytes = self.chunk_rows, self.field.step_bytes
        rows_only = self.plain and not self.fetcher.caching
        slots: dict[int, int] = {}
        views = self._views
        for dst, src, n, eid in runs:
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
                hit = None if self.plain else codecs.decoded_cache.get(self._decoded_key(path, start, stop))
                if hit is not None:
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
                    plan.copies.append((self, slots[c], _CHUNK, at, r, k, eid, c))

    def _decoded_key(self, path: str, start: int | None, stop: int | None) -> tuple[Any, ...] | None:
        """The decoded-chunk cache key of stored bytes ``[start, stop)`` of ``path``.

        Object-store arrays are written once: the range names its bytes. A
        local file may be replaced (the single array's last chunk grows with
        the next commit, vacuum shrinks it): its modification time and size
        join the key, so a replaced file never matches an older entry.
        """
        if not self.loc.is_local:
            return (path, start, stop)
        try:
            st = os.stat(path)
        except OSError:
            return None  # the read reports it
        return (path, start, stop, st.st_mtime_ns, st.st_size)

    def _keep_view(self, c: int, chunk: np.ndarray) -> None:
        """Keep decoded chunk ``c`` in the decoded-chunk cache, or raw chunk ``c`` (a view of a disk-cache
        entry's mapping) for later batches."""
        if not self.plain:
            codecs.decoded_cache.put(self._decoded_key(*self._chunk_range(c, -1)), chunk)
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


Run = tuple[int, int, int, int]  # (dst row, src row, count, episode id)
_ROWS, _CHUNK, _VIEW = 0, 1, 2  # a piece's source: fetched rows, a fetched chunk to decode, a kept chunk view
MAX_VIEWS = 4096  # raw disk-cache chunks an array keeps mapped


class _Plan:
    """A batch's byte ranges (with their cache flags) and where each piece goes."""

    def __init__(self) -> None:
        self.ranges: list[Range] = []
        self.cache: list[bool] = []
        self.views: list[np.ndarray] = []
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
    of every array at once, coalesced per object (:class:`~episodelake.fetch.Fetcher`).
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
        jobs = [(arr, blobs[slot]) for slot, (arr, _) in chunks]
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


def _decode_or_error(job: tuple[PlainArray, np.ndarray]) -> np.ndarray | ValueError:
    arr, blob = job
    try:
        return arr.decode(cast(bytes, blob))  # any buffer decodes; the ndarray avoids a copy
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


def read_many(requests: Sequence[tuple[TensorArray | PlainArray, int, int]]) -> list[np.ndarray]:
    """Read several row ranges at once: all reads are issued before any is awaited.

    Every read is awaited even after one failed (its ``ValueError`` is raised
    then), so no read is left in flight inside TensorStore.
    """
    for arr, start, stop in requests:
        if stop > arr.rows:
            raise CorruptionError(f"{arr.where}: rows [{start}, {stop}) requested but the array has {arr.rows} rows")
    planned: dict[str, list[int]] = {}  # field key -> requests read by the planned reader, in one fetch round
    for i, (arr, _, _) in enumerate(requests):
        if isinstance(arr, PlainArray):
            planned.setdefault(arr.field.key, []).append(i)
    futures: list[Any] = [None if isinstance(arr, PlainArray) else arr.read(a, b) for arr, a, b in requests]
    for group in planned.values():
        for i, value in zip(group, _read_planned([requests[i] for i in group]), strict=True):
            futures[i] = _Ready(value)
    out: list[np.ndarray] = []
    failure: tuple[ValueError, TensorArray | PlainArray] | None = None
    for (arr, _, _), future in zip(requests, futures, strict=True):
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


def _read_planned(requests: Sequence[tuple[TensorArray | PlainArray, int, int]]) -> list[np.ndarray]:
    """Row ranges of planned-reader arrays of one field, every byte range fetched in one round."""
    field = requests[0][0].field
    ends = np.cumsum([stop - start for _, start, stop in requests])
    flat = np.empty((int(ends[-1]) if len(ends) else 0, *field.shape), field.np_dtype)
    runs: dict[int, tuple[PlainArray, list[Run]]] = {}
    for (arr, start, stop), end in zip(requests, ends, strict=True):
        assert isinstance(arr, PlainArray)
        runs.setdefault(id(arr), (arr, []))[1].append((int(end) - (stop - start), start, stop - start, -1))
    copy_runs_many(list(runs.values()), flat)
    return np.split(flat, ends[:-1])
