"""Statistics: exact per-episode mergeable parts, their table columns, and their aggregation.

Every numeric per-step field (:func:`has_stats`) has, per episode, the parts
``count, sum, sumsq, min, max`` (:data:`STAT_PARTS`) of its values, one entry
per channel (the ``C`` axis of its layout, every element of a 1-D field, or a
single channel), stored in the table columns ``stats/<key>/<part>``
(:func:`stat_column`). Parts of disjoint row sets merge exactly
(:func:`merge_stats`), so a commit summarizes piece by piece and a subset's
statistics are one vectorized reduction over its episodes' parts
(:class:`StatsTable`), never a pass over steps or tensors.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import CorruptionError, QueryError
from .schema import DatasetSchema, FieldSpec

STAT_PARTS = ("count", "sum", "sumsq", "min", "max")
MOMENTS = ("count", "sum", "mean", "std", "min", "max")
_BLOCK = 256  # 8-bit values: float32 sums of <= 256 squares (<= 255**2 each) are exact


def has_stats(field: FieldSpec) -> bool:
    """True for the fields that have statistics: numeric (or bool) per-step fields."""
    return field.role != "meta" and field.np_dtype.kind in "biuf"


def stat_column(field: FieldSpec, part: str) -> str:
    """The episode table column holding statistic ``part`` of ``field``."""
    return f"stats/{field.key}/{part}"


def episode_stats(f: FieldSpec, values: np.ndarray) -> dict[str, Any]:
    """Mergeable statistics (exact) of ``values`` (rows of ``f``), per channel when the field has one."""
    axis = f.channel_axis
    channels = 1 if axis is None else f.shape[axis]
    if values.size == 0:
        return {"count": 0, "sum": None, "sumsq": None, "min": None, "max": None}
    moved = values if axis is None else np.moveaxis(values, axis + 1, 0)
    if values.dtype.itemsize == 1:
        # Images: float32 sums over blocks of 256 values are exact (every partial sum < 2**24).
        work: np.ndarray = np.ascontiguousarray(moved, dtype=np.float32).reshape(channels, -1)
        full = work.shape[1] - work.shape[1] % _BLOCK
        blocks = work[:, :full].reshape(channels, -1, _BLOCK)
        rest = work[:, full:].astype(np.float64)
        total = np.einsum("cbk->cb", blocks).sum(axis=1, dtype=np.float64) + rest.sum(axis=1)
        squares = np.einsum("cbk,cbk->cb", blocks, blocks).sum(axis=1, dtype=np.float64)
        squares += np.einsum("ck,ck->c", rest, rest)
    else:
        work = np.ascontiguousarray(moved, dtype=np.float64).reshape(channels, -1)
        total = work.sum(axis=1)
        squares = np.einsum("ck,ck->c", work, work)
    return {
        "count": int(work.shape[1]),
        "sum": total,
        "sumsq": squares,
        "min": work.min(axis=1).astype(np.float64),
        "max": work.max(axis=1).astype(np.float64),
    }


def merge_stats(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Combine the statistics of two disjoint row sets."""
    if a is None or not a["count"]:
        return b
    if not b["count"]:
        return a
    return {
        "count": a["count"] + b["count"],
        "sum": a["sum"] + b["sum"],
        "sumsq": a["sumsq"] + b["sumsq"],
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
    }


def return_field(schema: DatasetSchema) -> FieldSpec | None:
    """The field an episode's ``return`` sums: the one scalar numeric reward field, else None (no return)."""
    rewards = schema.role_fields("reward")
    if len(rewards) != 1 or rewards[0].np_dtype.kind not in "biuf" or rewards[0].shape != ():
        return None
    return rewards[0]


def stat_fields(schema: DatasetSchema, fields: Iterable[str] | None) -> list[FieldSpec]:
    """The fields a statistics request covers (default: every numeric per-step field); QueryError for others."""
    if fields is None:
        return [f for f in schema.step_fields if has_stats(f)]
    if isinstance(fields, str):
        fields = [fields]
    out = []
    for key in fields:
        f = next((f for f in schema.step_fields if f.key == key), None)
        if f is None or not has_stats(f):
            known = [f.key for f in schema.step_fields if has_stats(f)]
            raise QueryError(f"stats: {key!r} is not a numeric per-step field; fields with statistics: {known}")
        out.append(f)
    return out


class StatsTable:
    """Per-episode statistics of fields, one row per table-scan row, filled piece by piece.

    Each field's ``count`` is one array ``[rows]`` and its parts ``sum, sumsq,
    min, max`` one array ``[part, rows, channel]`` (a table file's rows of a
    part are one contiguous copy), so a subset's statistics are one gather of
    its rows and one reduction per part (:meth:`aggregate`):
    no SQL, no pass over steps or tensors. Rows not yet filled must not be
    aggregated (the caller fills every row it asks for, and a table file's
    rows all at once).

    ``file`` is each row's table file (``files`` of them). The rows of a file
    never change within a table (a snapshot's scan), so each file's totals are
    reduced once, the first time a subset holds all of its rows, and a subset
    holding whole files merges their totals instead of their episodes (the
    whole table: one merge of a row per file).
    """

    def __init__(self, file: np.ndarray, files: int) -> None:
        self.rows = len(file)
        self._file = file
        self._file_rows = np.bincount(file, minlength=files)
        self._count: dict[str, np.ndarray] = {}
        self._parts: dict[str, np.ndarray] = {}  # parts in STAT_PARTS[1:] order
        self._totals: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # key -> (done, count, parts)
        self._lock = threading.Lock()

    def _arrays(self, f: FieldSpec) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if f.key not in self._count:  # untouched pages of the allocations cost no memory
                self._count[f.key] = _lazy_zeros((self.rows,), np.int64)
                self._parts[f.key] = _lazy_zeros((len(STAT_PARTS) - 1, self.rows, f.stat_channels), np.float64)
            return self._count[f.key], self._parts[f.key]

    def fill(self, f: FieldSpec, rows: np.ndarray, tbl: pa.Table) -> None:
        """Store the statistics columns of ``f`` in ``tbl`` (lists over channels, as 0.1.0 wrote) at ``rows``.

        ``rows`` are increasing scan rows, one per row of ``tbl``. A part that
        does not hold one value per channel for every episode with values
        raises :class:`CorruptionError`.
        """
        channels = f.stat_channels
        counts, parts = self._arrays(f)
        count = _array(tbl.column(stat_column(f, "count"))).fill_null(0).to_numpy()
        valid = count > 0
        cols = [_array(tbl.column(stat_column(f, p))) for p in STAT_PARTS[1:]]
        held = [_held(col) for col in cols]
        listed = held[0] == channels  # rows holding one value per channel (rows without values may hold none)
        for part, h in zip(STAT_PARTS[1:], held, strict=True):
            if (h != np.where(listed, channels, 0)).any() or (valid & ~listed).any():
                raise CorruptionError(
                    f"field {f.key!r}: statistics {part!r} do not hold {channels} values for each of the "
                    f"{int(valid.sum())} episodes with values"
                )
        # the rows of one table file are one run of scan rows: a slice copies, a gather scatters
        run = listed.all() and len(rows) > 0 and rows[-1] - rows[0] == len(rows) - 1
        target = slice(int(rows[0]), int(rows[-1]) + 1) if run else rows[listed]
        for i, col in enumerate(cols):
            parts[i, target] = pc.list_flatten(col).to_numpy(zero_copy_only=False).reshape(-1, channels)
        counts[rows] = count

    def aggregate(self, f: FieldSpec, rows: np.ndarray) -> dict[str, Any]:
        """Count, sum, mean, population std, min and max of ``f`` over distinct ``rows`` (per channel if it has one)."""
        counts, parts = self._arrays(f)
        if len(rows) == self.rows:  # every row: no per-row pass
            whole = self._file_rows > 0
        else:
            per_file = np.bincount(self._file[rows], minlength=len(self._file_rows))
            whole = (per_file == self._file_rows) & (per_file > 0)
        n = 0
        merged: list[np.ndarray] = []
        if whole.any():
            file_count, file_parts = self._file_totals(f, whole)
            n, merged = int(file_count[whole].sum()), [file_parts[:, whole]]
            rows = rows[:0] if whole.all() else rows[~whole[self._file[rows]]]
        count = counts[rows]
        held = rows[count > 0]
        if len(held) or not merged:
            merged.append(parts if len(held) == self.rows else np.take(parts, held, axis=1))
        block = merged[0] if len(merged) == 1 else np.concatenate(merged, axis=1)
        return _field_moments(f, moments(n + int(count.sum()), *block))

    def _file_totals(self, f: FieldSpec, files: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-file count ``[files]`` and parts ``[part, files, channel]`` of ``f``, reduced for the ``files`` (a mask)
        not reduced yet; a file without values holds sums 0, min +inf and max -inf (neutral in a merge)."""
        counts, parts = self._arrays(f)
        with self._lock:
            if f.key not in self._totals:
                n_files, channels = len(self._file_rows), f.stat_channels
                lo_hi = np.full((2, n_files, channels), np.inf) * np.array([1.0, -1.0])[:, None, None]
                total = np.concatenate([np.zeros((2, n_files, channels)), lo_hi])
                self._totals[f.key] = (np.zeros(n_files, dtype=bool), np.zeros(n_files, dtype=np.int64), total)
            done, file_count, file_parts = self._totals[f.key]
            todo = files & ~done
            if todo.any():
                rows = np.flatnonzero(todo[self._file])
                rows = rows[np.argsort(self._file[rows], kind="stable")]
                np.add.at(file_count, self._file[rows], counts[rows])
                held = rows[counts[rows] > 0]
                owner, starts = np.unique(self._file[held], return_index=True)
                if len(held):
                    block = np.take(parts, held, axis=1)
                    for i, ufunc in enumerate((np.add, np.add, np.minimum, np.maximum)):
                        file_parts[i, owner] = ufunc.reduceat(block[i], starts, axis=0)
                done |= todo
            return file_count, file_parts


def values_moments(f: FieldSpec, values: np.ndarray) -> dict[str, Any]:
    """What :meth:`StatsTable.aggregate` gives, computed from the rows ``values`` of ``f`` themselves.

    For columns without commit-time statistics (derived columns, small by
    nature: they live in the table).
    """
    parts = episode_stats(f, values)
    if not parts["count"]:
        empty = np.zeros((0, f.stat_channels))
        return _field_moments(f, moments(0, empty, empty, empty, empty))
    rows = [np.asarray(parts[p], dtype=np.float64)[None] for p in STAT_PARTS[1:]]
    return _field_moments(f, moments(int(parts["count"]), *rows))


def _field_moments(f: FieldSpec, per: dict[str, Any]) -> dict[str, Any]:
    """``per`` (channel arrays) as a field's statistics: arrays for a field with channels, else floats."""
    out: dict[str, Any] = {"count": per["count"]}
    for m in MOMENTS[1:]:
        out[m] = per[m] if f.channel_axis is not None else float(per[m][0])
    return out


def _lazy_zeros(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A zero array in anonymous memory, committed page by page as it is written.

    Not NumPy's allocation: NumPy asks for transparent huge pages, and where
    memory is fragmented (after a large scan) each 2 MiB fault waits for the
    kernel to compact memory; filling statistics then took 4x longer.
    """
    size = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    memory = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype=dtype, count=int(np.prod(shape))).reshape(shape)


def _array(col: pa.ChunkedArray) -> pa.Array:
    """One array of a column, without a copy when it has a single chunk."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _held(col: pa.ListArray) -> np.ndarray:
    """Values held per row of a list column (0 for a NULL row)."""
    return np.diff(col.offsets.to_numpy()) * col.is_valid().to_numpy(zero_copy_only=False)


def moments(n: int, total: np.ndarray, sumsq: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    """:data:`MOMENTS` from mergeable parts (one row per piece; columns are channels): NaN when ``n`` is 0.

    ``std`` is the population standard deviation ``sqrt(E[x^2] - E[x]^2)``, clamped at 0 against rounding.
    """
    if n == 0:
        nan = np.full(total.shape[1:], np.nan)
        return {"count": 0, "sum": nan, "mean": nan, "std": nan, "min": nan, "max": nan}
    s = total.sum(axis=0)
    mean = s / n
    return {
        "count": n,
        "sum": s,
        "mean": mean,
        "std": np.sqrt(np.maximum(sumsq.sum(axis=0) / n - mean * mean, 0)),
        "min": lo.min(axis=0),
        "max": hi.max(axis=0),
    }


def value_moments(values: np.ndarray) -> dict[str, float | int]:
    """:data:`MOMENTS` of one value per episode (length, return): floats, ``count`` an int."""
    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    per = moments(len(v), v, v * v, v, v)
    return {m: per[m] if m == "count" else float(per[m][0]) for m in MOMENTS}
