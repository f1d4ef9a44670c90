"""Zarr v3 tensor arrays written and read through TensorStore.

One array per tensor field per writer, at ``tensors/<writer>/<field key>``,
shape ``[rows, *field.shape]``, chunked along time only. Codecs and chunk
shapes are always explicit (TensorStore's defaults for an empty resizable
array are one-row chunks). On object stores the sharding codec packs many
inner chunks into one object, so a random segment read is a few byte-range
GETs and the object count stays small.

Arrays are append-only: a writer owns its arrays, appends rows and only then
commits table rows that reference them, so a crash leaves unreferenced rows
and never a half episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from .errors import CorruptionError
from .location import Location
from .schema import FieldSpec

SHARD_CHUNKS = 64  # inner chunks per shard object on object stores


def make_context(durable: bool = False, cache_bytes: int = 0) -> ts.Context:
    """TensorStore context: fsync only when ``durable``; optional chunk cache."""
    spec: dict[str, Any] = {"file_io_sync": durable, "data_copy_concurrency": {"limit": 4}}
    if cache_bytes:
        spec["cache_pool"] = {"total_bytes_limit": int(cache_bytes)}
    return ts.Context(spec)


def zarr_metadata(field: FieldSpec, sharded: bool) -> dict[str, Any]:
    """Explicit Zarr v3 metadata for a field's (empty, resizable) array."""
    rows = field.rows_per_chunk
    inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if field.np_dtype.itemsize == 1 or field.np_dtype == np.bool_:
        inner = [{"name": "bytes"}]
    if field.compression == "zstd":
        inner.append({"name": "zstd", "configuration": {"level": 3}})
    chunk = [rows, *field.shape]
    if sharded:
        codecs: list[dict[str, Any]] = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": chunk,
                    "codecs": inner,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                },
            }
        ]
        chunk = [rows * SHARD_CHUNKS, *field.shape]
    else:
        codecs = inner
    return {
        "shape": [0, *field.shape],
        "data_type": field.np_dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": codecs,
        "fill_value": _fill_value(field.np_dtype),
        "dimension_names": ["t", *(list(field.layout) if field.layout else [None] * len(field.shape))],
    }


def _fill_value(dtype: np.dtype) -> Any:
    if dtype == np.bool_:
        return False
    return [0, 0] if dtype.kind == "c" else 0


def array_parts(writer: str, field: FieldSpec) -> tuple[str, ...]:
    return ("tensors", writer, *field.key.split("/"))


class TensorArray:
    """One append-only Zarr v3 array (rows along axis 0)."""

    # Each append starts at a multiple of this many rows. Sharded arrays (object
    # stores) use the shard's rows: a shard object is then written by one
    # append only, never read back and rewritten; the skipped rows are never
    # written (nothing is stored for them) nor referenced.
    align = 1

    def __init__(self, store: ts.TensorStore, field: FieldSpec, where: str) -> None:
        self.store = store
        self.field = field
        self.where = where
        self.rows = int(store.domain.exclusive_max[0])

    @classmethod
    def create(cls, loc: Location, writer: str, field: FieldSpec, context: ts.Context) -> TensorArray:
        parts = array_parts(writer, field)
        spec = {
            "driver": "zarr3",
            "kvstore": loc.kvstore(*parts),
            "metadata": zarr_metadata(field, sharded=not loc.is_local),
            "create": True,
            # Every written chunk is stored (even all-zero ones), so a missing chunk is an error on read.
            "store_data_equal_to_fill_value": True,
        }
        arr = cls(ts.open(spec, context=context).result(), field, loc.child_url(*parts))
        if not loc.is_local:
            arr.align = int(spec["metadata"]["chunk_grid"]["configuration"]["chunk_shape"][0])
        return arr

    @classmethod
    def open(
        cls, loc: Location, writer: str, field: FieldSpec, context: ts.Context, read_only: bool = True
    ) -> TensorArray:
        parts = array_parts(writer, field)
        spec = {"driver": "zarr3", "kvstore": loc.kvstore(*parts), "open": True}
        if read_only:
            spec["fill_missing_data_reads"] = False  # a deleted chunk must fail, not read as zeros
        if not loc.is_local:
            # Committed shards never change (appends start on a fresh shard), so a
            # cached chunk needs no revalidating GET; the metadata still does.
            spec["recheck_cached_data"] = False
        try:
            store = ts.open(spec, context=context, read=True, write=not read_only).result()
        except ValueError as exc:
            raise CorruptionError(f"tensor array {loc.child_url(*parts)} cannot be opened: {exc}") from exc
        if tuple(store.shape[1:]) != field.shape or store.dtype.numpy_dtype != field.np_dtype:
            raise CorruptionError(
                f"tensor array {loc.child_url(*parts)} has shape {store.shape[1:]} / dtype "
                f"{store.dtype.numpy_dtype}, schema says {field.shape} / {field.np_dtype}"
            )
        return cls(store, field, loc.child_url(*parts))

    @property
    def write_rows(self) -> int:
        """Rows per write unit (a chunk, or a shard on object stores): writes aligned to it never overlap."""
        return int(self.store.chunk_layout.write_chunk.shape[0])

    def reserve(self, rows: int) -> int:
        """Grow the array by ``rows`` rows (from an aligned start); return the first of them."""
        start = -(-self.rows // self.align) * self.align
        end = start + rows
        self.store = self.store.resize(
            exclusive_max=[end, *self.field.shape], resize_metadata_only=True, expand_only=True
        ).result()
        self.rows = end
        return start

    def write(self, start: int, values: np.ndarray) -> ts.Future:
        """Write ``values`` at rows ``[start, start + len(values))`` of reserved space."""
        return self.store[start : start + len(values)].write(values)

    def append_block(self, block: np.ndarray) -> tuple[int, ts.Future]:
        """Reserve ``len(block)`` rows and write ``block`` there in one write.

        Returns the first row and the write future; the caller must await it
        before committing rows that reference the data.
        """
        start = self.reserve(len(block))
        return start, self.write(start, block)


def read_many(requests: Sequence[tuple[TensorArray, int, int]]) -> list[np.ndarray]:
    """Read several row ranges at once: all futures are issued before any is awaited."""
    futures = []
    for arr, start, stop in requests:
        if stop > arr.rows:
            raise CorruptionError(f"{arr.where}: rows [{start}, {stop}) requested but the array has {arr.rows} rows")
        futures.append(arr.store[start:stop].read())
    return [f.result() for f in futures]
