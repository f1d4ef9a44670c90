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
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import CorruptionError, QueryError
from .schema import DatasetSchema, FieldSpec

STAT_PARTS = ("count", "sum", "sumsq", "min", "max")
STATS_PREFIX = "stats/"  # every statistics column's name starts so
MOMENTS = ("count", "sum", "mean", "std", "min", "max")
_BLOCK = 256  # 8-bit values: float32 sums of <= 256 squares (<= 255**2 each) are exact


def has_stats(field: FieldSpec) -> bool:
    """True for the fields that have statistics: numeric (or bool) per-step fields."""
    return field.role != "meta" and field.np_dtype.kind in "biuf"


def stat_column(field: FieldSpec, part: str) -> str:
    """The episode table column holding statistic ``part`` of ``field``."""
    return f"{STATS_PREFIX}{field.key}/{part}"


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

    Each :meth:`fill` keeps its piece as read: a field's ``count`` per row
    and each part ``sum, sumsq, min, max`` as one ``[values, channel]`` array
    over the Arrow buffers the table file was decoded into (no copy), so a
    subset's statistics are one gather of its rows from each piece and one
    reduction per part (:meth:`aggregate`): no SQL, no pass over steps or
    tensors. Rows not yet filled must not be aggregated (the caller fills
    every row it asks for, and a table file's rows all at once).

    ``file`` is each row's table file (``files`` of them); its length is the
    number of rows. The rows of a piece never change within a table (a
    snapshot's scan), so each piece's totals are reduced once, the first time
    a subset holds all of its rows, and a subset holding whole pieces merges
    their totals instead of their episodes (the whole table: one merge of a
    row per piece).
    """

    def __init__(self, file: np.ndarray, files: int) -> None:
        self.rows = len(file)
        self._pieces: dict[str, list[_Piece]] = {}
        self._owner: dict[str, np.ndarray] = {}  # key -> each row's piece
        self._local: dict[str, np.ndarray] = {}  # key -> each row's index in its piece
        self._lock = threading.Lock()

    def fill(self, f: FieldSpec, rows: np.ndarray, tbl: pa.Table) -> None:
        """Keep the statistics columns of ``f`` in ``tbl`` (lists over channels, as 0.1.0 wrote) for ``rows``.

        ``rows`` are increasing scan rows, one per row of ``tbl``. A part that
        does not hold one value per channel for every episode with values
        raises :class:`CorruptionError`.
        """
        channels = f.stat_channels
        count = _filled(_array(tbl.column(stat_column(f, "count"))), 0).to_numpy()
        valid = count > 0
        cols = [_array(tbl.column(stat_column(f, p))) for p in STAT_PARTS[1:]]
        held = [_held(col) for col in cols]
        listed = held[0] == channels  # rows holding one value per channel (rows without values may hold none)
        every = bool(listed.all())
        expected = channels if every else np.where(listed, channels, 0)
        for part, h in zip(STAT_PARTS[1:], held, strict=True):
            if (h != expected).any() or (not every and (valid & ~listed).any()):
                raise CorruptionError(
                    f"field {f.key!r}: statistics {part!r} do not hold {channels} values for each of the "
                    f"{int(valid.sum())} episodes with values"
                )
        values = [
            np.asarray(pc.list_flatten(col).to_numpy(zero_copy_only=False), np.float64).reshape(-1, channels)
            for col in cols
        ]
        slot = None if every else np.cumsum(listed) - 1  # a listed row's index in the values
        with self._lock:
            if f.key not in self._pieces:  # untouched pages of the allocations cost no memory
                self._pieces[f.key] = []
                self._owner[f.key] = _lazy_zeros((self.rows,), np.int32)
                self._local[f.key] = _lazy_zeros((self.rows,), np.int32)
            pieces = self._pieces[f.key]
            # a table file's rows are mostly one run of scan rows: a slice, not a scatter
            at = slice(int(rows[0]), int(rows[-1]) + 1) if len(rows) and rows[-1] - rows[0] == len(rows) - 1 else rows
            self._owner[f.key][at] = len(pieces)
            self._local[f.key][at] = np.arange(len(rows), dtype=np.int32)
            pieces.append(_Piece(count, values, slot))

    def aggregate(self, f: FieldSpec, rows: np.ndarray) -> dict[str, Any]:
        """Count, sum, mean, population std, min and max of ``f`` over distinct ``rows`` (per channel if it has one)."""
        with self._lock:
            pieces = list(self._pieces.get(f.key, ()))
            owner, local = self._owner.get(f.key), self._local.get(f.key)
        sizes = np.array([len(p.count) for p in pieces], dtype=np.int64)
        if len(rows) == self.rows or owner is None or local is None:  # every row: no per-row pass
            taken = sizes if len(rows) else np.zeros_like(sizes)
            mine = rows[:0]
        else:
            mine = owner[rows]
            taken = np.bincount(mine, minlength=len(pieces))
        whole = (taken == sizes) & (sizes > 0)
        n = 0
        merged = []  # per piece: its parts over the rows asked for, reduced ([part, channel])
        for i in np.flatnonzero(whole):
            count, parts = pieces[i].totals()
            n += count
            merged.append(parts)
        if not whole.all() and local is not None:
            partial = ~whole[mine]
            if not partial.all():
                rows, mine = rows[partial], mine[partial]
            # the rows of a piece are mostly one run of the (sorted) rows: sort only when they are not
            by_piece = np.arange(len(mine)) if (np.diff(mine) >= 0).all() else np.argsort(mine, kind="stable")
            starts = np.flatnonzero(np.diff(mine[by_piece], prepend=-1))
            for group in np.split(by_piece, starts[1:]):
                if len(group):
                    piece = pieces[int(mine[group[0]])]
                    at = local[rows[group]]
                    count = piece.count[at]
                    held = at[count > 0]
                    if len(held):
                        n += int(count.sum())
                        merged.append(piece.reduced(held))
        if not merged:
            return _field_moments(f, moments(0, *np.zeros((len(STAT_PARTS) - 1, 0, f.stat_channels))))
        return _field_moments(f, moments(n, *np.stack(merged, axis=1)))


@dataclass
class _Piece:
    """One :meth:`StatsTable.fill`: each row's count, and each part's values of the rows that list them."""

    count: np.ndarray  # int64 [rows]
    values: list[np.ndarray]  # per part (STAT_PARTS[1:] order): [listed rows, channel]
    slot: np.ndarray | None  # each row's index in the values (None: every row lists them, in order)
    _totals: tuple[int, np.ndarray] | None = None

    def reduced(self, at: np.ndarray | None) -> np.ndarray:
        """Parts ``[part, channel]`` merged over the piece's rows ``at`` (rows with values; None: every row)."""
        if at is not None and self.slot is not None:
            at = self.slot[at]
        if at is None:
            return np.stack([_fold(ufunc, v) for ufunc, v in zip(_MERGES, self.values, strict=True)])
        gathered = np.empty((len(at), self.values[0].shape[1]))  # one buffer for every part: fresh pages fault once
        out = []
        for ufunc, v in zip(_MERGES, self.values, strict=True):
            out.append(_fold(ufunc, _take_rows(v, at, gathered), scratch=True).copy())
        return np.stack(out)

    def totals(self) -> tuple[int, np.ndarray]:
        """The piece's count and parts ``[part, channel]`` over all its rows, reduced once; a piece without
        values holds sums 0, min +inf and max -inf (neutral in a merge)."""
        if self._totals is None:
            held = np.flatnonzero(self.count > 0)
            if len(held):
                every = len(held) == len(self.count) and self.slot is None
                parts = self.reduced(None if every else held)
            else:
                channels = self.values[0].shape[1]
                parts = np.stack(
                    [np.zeros(channels), np.zeros(channels), np.full(channels, np.inf), np.full(channels, -np.inf)]
                )
            self._totals = int(self.count[held].sum()), parts
        return self._totals


_MERGES = (np.add, np.add, np.minimum, np.maximum)  # how each of STAT_PARTS[1:] merges


def _fold(ufunc: np.ufunc, values: np.ndarray, scratch: bool = False) -> np.ndarray:
    """``ufunc.reduce(values, axis=0)`` of ``[rows, channel]`` values (at least one row), by halving the rows.

    NumPy reduces a C-ordered array along its first axis one row at a time,
    an inner loop as short as the channels: 4-7x slower, for a few channels,
    than these ``log2(rows)`` passes over contiguous halves. A sum so taken is
    pairwise, so also more accurate. With ``scratch`` the halves are folded
    into ``values`` itself (the result is then a view of it); otherwise the
    first pass allocates half of ``values`` and later passes fold into that.
    """
    if values.shape[1] == 1:  # one channel: NumPy's reduce is already contiguous
        return ufunc.reduce(values, axis=0)
    while len(values) > 1:
        half = len(values) // 2
        folded = ufunc(values[:half], values[half : 2 * half], out=values[:half] if scratch else None)
        if len(values) % 2:  # the odd last row: rows from 2 * half on are never written by the fold
            folded[0] = ufunc(folded[0], values[-1])
        values, scratch = folded, True
    return values[0]


def _take_rows(values: np.ndarray, at: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``values[at]`` of C-ordered ``[rows, channel]`` values, written to ``out``.

    Each row is taken as one opaque item (a void view): 2.5-4x faster than
    ``np.take(axis=0)``, which copies a row channel by channel; ``clip``
    skips the buffered copy ``raise`` makes into ``out`` (``at`` is in range).
    """
    values = np.ascontiguousarray(values)  # a no-op for the arrays fill() keeps
    item = np.dtype((np.void, values.shape[1] * values.itemsize))
    np.take(values.view(item).reshape(-1), at, out=out.view(item).reshape(-1), mode="clip")
    return out


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


def _filled(col: pa.Array, value: object) -> pa.Array:
    """``col`` with NULLs replaced by ``value`` (``col`` itself when it has none: no pass, no copy)."""
    return col.fill_null(value) if col.null_count else col


def _held(col: pa.ListArray) -> np.ndarray:
    """Values held per row of a list column (0 for a NULL row)."""
    held = np.diff(col.offsets.to_numpy())
    return held * col.is_valid().to_numpy(zero_copy_only=False) if col.null_count else held


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
