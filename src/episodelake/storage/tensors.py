"""Zarr v3 tensor arrays (layout: :mod:`~episodelake.storage.arrays`) written and read through TensorStore.

Object-store operations wait as the location's
:class:`~episodelake.storage.location.StorageTimeouts` allow; one that fails for a
storage reason (endpoint down, throttled past its retries, no answer in time)
raises :class:`~episodelake.core.errors.StorageError` naming the dataset and the
array, never :class:`CorruptionError`.

TensorStore aborts a process that uses it after ``fork()`` from a process that
did. A forked process (a ``DataLoader`` worker, by default on Linux) therefore
reads through :class:`~episodelake.storage.planned.PlainArray`: the same Zarr
files decoded in Python, no TensorStore.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from ..core.errors import CorruptionError, ValidationError
from ..core.schema import FieldSpec
from .arrays import COMMIT_SHIFT, ROW_MASK, Run, array_parts, check_layout, zarr_metadata
from .engine import start_engine, wait
from .faults import storage_fault
from .location import Location


def make_context(durable: bool = False, cache_bytes: int = 0) -> ts.Context:
    """TensorStore context: fsync only when ``durable``; optional chunk cache."""
    spec: dict[str, Any] = {"file_io_sync": durable, "data_copy_concurrency": {"limit": 4}}
    if cache_bytes:
        spec["cache_pool"] = {"total_bytes_limit": int(cache_bytes)}
    return ts.Context(spec)


def fault(exc: BaseException, loc: Location, where: str, doing: str) -> BaseException:
    """What a failed TensorStore operation on ``where`` raises: a :class:`StorageError` for storage faults, else
    ``exc`` (the caller decides whether that is corruption)."""
    err = storage_fault(exc, dataset=loc.url, object=where, doing=doing, endpoint=loc.endpoint)
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
            check_layout(where, store.shape, store.dtype.numpy_dtype, field)
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

    def copy_runs(self, out: np.ndarray, runs: list[Run]) -> None:
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
