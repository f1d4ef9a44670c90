"""Zarr v3 tensor arrays as stored: layout, references, metadata, listing, and the read surface.

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

Two readers understand these arrays, both :class:`ArrayReader`:
:class:`~episodelake.storage.tensors.TensorArray` (TensorStore, which also
writes them) and :class:`~episodelake.storage.planned.PlainArray` (planned
byte ranges decoded in Python, no TensorStore).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..core import codecs
from ..core.errors import CorruptionError
from ..core.schema import FRAMES_PER_SHARD, FieldSpec
from . import layout
from .location import Location

SHARD_CHUNKS = 64  # most inner chunks per shard object on object stores
COMMIT_SHIFT = 32  # ref = commit << COMMIT_SHIFT | row
ROW_MASK = (1 << COMMIT_SHIFT) - 1
NO_CHUNK = (1 << 64) - 1  # sharding index entry of an inner chunk that was never written

Run = tuple[int, int, int, int]  # (dst row, src row, count, episode id)


class Rows(Protocol):
    """Rows being read: ``result()`` waits for them (a ``ValueError`` when they cannot be read)."""

    def result(self) -> np.ndarray: ...


@runtime_checkable
class ArrayReader(Protocol):
    """The read surface of one stored array of ``field``: what every reader of tensor rows provides.

    The array holds ``rows`` rows of shape ``field.shape`` and dtype
    ``field.np_dtype``; ``where`` is its URL, for messages. A row range
    outside ``[0, rows)`` is the caller's to refuse (:func:`~episodelake.storage.planned.read_many` does).
    """

    field: FieldSpec
    rows: int
    where: str

    def read(self, start: int, stop: int) -> Rows:
        """Rows ``[start, stop)``, in flight until ``result()``."""
        ...

    def copy_runs(self, out: np.ndarray, runs: list[Run]) -> None:
        """Copy runs ``(dst row, src row, count, episode id)`` into ``out``; unreadable rows raise
        :class:`~episodelake.core.errors.CorruptionError` naming the episode, storage faults
        :class:`~episodelake.core.errors.StorageError`."""
        ...


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
    if fit and rows and not field.framed:
        chunk_rows = -(-rows // -(-rows // chunk_rows))  # ceil(rows / fewest chunks)
    elif fit:
        chunk_rows = min(chunk_rows, max(1, rows))
    inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if field.np_dtype.itemsize == 1 or field.np_dtype == np.bool_:
        inner = [{"name": "bytes"}]
    inner += codecs.lossless_codecs(field.compression, field.np_dtype.itemsize)
    chunk = [chunk_rows, *field.shape]
    per_shard = min(SHARD_CHUNKS, max(1, -(-rows // chunk_rows))) if rows else SHARD_CHUNKS
    if field.framed:  # see frames.FrameArray
        assert field.codec is not None and field.layout is not None
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
    return layout.array_parts(writer, field.array_key, commit)


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


def check_layout(where: str, shape: Sequence[int], dtype: np.dtype, field: FieldSpec) -> None:
    """Raise :class:`CorruptionError` unless an array's row shape and dtype are ``field``'s."""
    if tuple(shape[1:]) != field.shape or np.dtype(dtype) != field.np_dtype:
        raise CorruptionError(
            f"tensor array {where} has shape {tuple(shape[1:])} / dtype {np.dtype(dtype)}, "
            f"schema says {field.shape} / {field.np_dtype}"
        )
