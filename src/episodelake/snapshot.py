"""One pinned version of a dataset, loaded lazily into NumPy for fast reads.

A :class:`Snapshot` orders episodes by ``(created_at, episode_id)`` (stable
across versions: appends only add rows at the end of that order) and exposes:

* the episode index (ids, lengths, flags, meta, tensor refs) as NumPy arrays;
* each small per-step field as one contiguous NumPy array of all episodes'
  rows plus row offsets (loaded on first use, from Arrow list values);
* TensorStore handles for each tensor field of each writer.

Readers of a snapshot see exactly the episodes of its version.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorstore as ts

from .errors import CorruptionError
from .location import Location
from .schema import DatasetSchema, FieldSpec, from_storage, storage_dtype
from .table import EpisodeTable
from .tensors import TensorArray, read_many

INDEX_COLUMNS = ("episode_id", "writer", "length", "terminated", "truncated", "return", "created_at")


def flatten_lists(col: pa.ChunkedArray | pa.Array, depth: int) -> np.ndarray:
    """Values of a ``depth``-deep list column as one NumPy array (no copy when possible)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    for _ in range(depth):
        arr = pc.list_flatten(arr)
    return arr.to_numpy(zero_copy_only=False)


class Snapshot:
    """Episodes of one table version, in stable order. Thread-safe lazy loading."""

    def __init__(self, loc: Location, schema: DatasetSchema, table: EpisodeTable, context: ts.Context) -> None:
        self.loc = loc
        self.schema = schema
        self.version = table.version
        self._dataset = table.dataset()
        self._context = context
        self._lock = threading.Lock()
        self._fields: dict[str, np.ndarray] = {}
        self._arrays: dict[tuple[str, str], TensorArray] = {}

    def arrow_dataset(self):
        return self._dataset

    @cached_property
    def index(self) -> dict[str, np.ndarray]:
        """Index columns (+ meta and tensor refs) as NumPy, in episode order."""
        cols = list(INDEX_COLUMNS)
        cols += [f.key for f in self.schema.meta_fields]
        for f in self.schema.tensor_fields:
            cols += [f"ref/{f.key}", f"crc/{f.key}"]
        tbl = self._dataset.to_table(columns=cols)
        order = pc.sort_indices(tbl, sort_keys=[("created_at", "ascending"), ("episode_id", "ascending")])
        tbl = tbl.take(order)
        out: dict[str, np.ndarray] = {}
        meta = {f.key for f in self.schema.meta_fields}
        for name in cols:
            col = tbl.column(name)
            # meta columns may hold nulls and lists: keep them as Python objects
            out[name] = np.array(col.to_pylist(), dtype=object) if name in meta else col.to_numpy()
        return out

    @cached_property
    def num_episodes(self) -> int:
        return len(self.index["episode_id"])

    @cached_property
    def lengths(self) -> np.ndarray:
        return self.index["length"].astype(np.int64)

    @cached_property
    def step_offsets(self) -> np.ndarray:
        """Start of each episode's transitions in a concatenation of all episodes."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    @cached_property
    def obs_offsets(self) -> np.ndarray:
        """Start of each episode's observation rows (T + 1 per episode)."""
        return np.concatenate([[0], np.cumsum(self.lengths + 1)]).astype(np.int64)

    @cached_property
    def position_of_id(self) -> dict[int, int]:
        return {int(e): i for i, e in enumerate(self.index["episode_id"])}

    def offsets(self, f: FieldSpec) -> np.ndarray:
        return self.obs_offsets if f.role == "observation" else self.step_offsets

    def meta(self, pos: int) -> dict[str, Any]:
        """Per-episode meta values of episode ``pos`` in their schema dtype (None if unset)."""
        out: dict[str, Any] = {}
        for f in self.schema.meta_fields:
            v = self.index[f.key][pos]
            if v is None or f.np_dtype.kind == "U":
                out[f.name] = v
            else:
                out[f.name] = from_storage(np.asarray(v, dtype=storage_dtype(f.np_dtype)), f.np_dtype)[()]
        return out

    def table_field(self, f: FieldSpec) -> np.ndarray:
        """All rows of a small per-step field, episode after episode, schema dtype."""
        with self._lock:
            if f.key in self._fields:
                return self._fields[f.key]
            tbl = self._dataset.to_table(columns=["episode_id", f.key])
            ids = tbl.column("episode_id").to_numpy()
            pos = np.fromiter((self.position_of_id[int(i)] for i in ids), np.int64, len(ids))
            col = tbl.column(f.key).combine_chunks().take(pa.array(np.argsort(pos)))
            depth = 1 + len(f.shape) + (1 if f.np_dtype.kind == "c" else 0)
            values = flatten_lists(col, depth)
            rows = self.offsets(f)[-1]
            inner = f.shape + ((2,) if f.np_dtype.kind == "c" else ())
            if values.size != rows * int(np.prod(inner, dtype=np.int64)):
                raise CorruptionError(
                    f"field {f.key!r}: table holds {values.size} values, episode lengths imply {rows} rows"
                )
            arr = from_storage(values.reshape(rows, *inner), f.np_dtype)
            self._fields[f.key] = arr
            return arr

    def tensor_array(self, writer: str, f: FieldSpec) -> TensorArray:
        key = (writer, f.key)
        with self._lock:
            if key not in self._arrays:
                self._arrays[key] = TensorArray.open(self.loc, writer, f, self._context)
            return self._arrays[key]

    def field_rows(self, f: FieldSpec, pos: int) -> tuple[int, int]:
        """(start, stop) of episode ``pos``'s rows of ``f`` in its storage."""
        n = int(self.lengths[pos]) + (1 if f.role == "observation" else 0)
        if f.in_tensor:
            start = int(self.index[f"ref/{f.key}"][pos])
        else:
            start = int(self.offsets(f)[pos])
        return start, start + n

    def read_ranges(self, f: FieldSpec, pos: Sequence[int], lo: Sequence[int], hi: Sequence[int]) -> list[np.ndarray]:
        """Rows ``[lo, hi)`` (episode-relative) of field ``f`` for episodes ``pos``."""
        if not f.in_tensor:
            values = self.table_field(f)
            base = self.offsets(f)
            return [values[base[p] + a : base[p] + b] for p, a, b in zip(pos, lo, hi, strict=True)]
        requests = []
        for p, a, b in zip(pos, lo, hi, strict=True):
            writer = str(self.index["writer"][p])
            arr = self.tensor_array(writer, f)
            start, stop = self.field_rows(f, p)
            if stop > arr.rows:
                raise CorruptionError(
                    f"episode {int(self.index['episode_id'][p])}: field {f.key!r} references rows "
                    f"[{start}, {stop}) but {arr.where} has {arr.rows} rows"
                )
            requests.append((arr, start + a, start + b))
        return read_many(requests)
