"""Statistics: exact per-episode mergeable parts, their table columns, and their aggregation.

Every numeric per-step field (:func:`has_stats`) has, per episode, the parts
``count, sum, sumsq, min, max`` (:data:`STAT_PARTS`) of its values, one entry
per channel (the ``C`` axis of its layout, every element of a 1-D field, or a
single channel), stored in the table columns ``stats/<key>/<part>``
(:func:`stat_column`). Parts of disjoint row sets merge exactly
(:func:`merge_stats`), so a commit summarizes piece by piece and a subset's
statistics are one SQL aggregate over its episodes' parts (:func:`aggregate`),
never a pass over steps or tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import CorruptionError, QueryError
from .schema import DatasetSchema, FieldSpec
from .sql import quote, sql_template

STAT_PARTS = ("count", "sum", "sumsq", "min", "max")
MOMENTS = ("count", "sum", "mean", "std", "min", "max")
_BLOCK = 256  # 8-bit values: float32 sums of <= 256 squares (<= 255**2 each) are exact


def has_stats(field: FieldSpec) -> bool:
    """True for the fields that have statistics: numeric (or bool) per-step fields."""
    return field.role != "meta" and field.np_dtype.kind in "biuf"


def stat_column(field: FieldSpec, part: str) -> str:
    """The episode table column holding statistic ``part`` of ``field``."""
    return f"stats/{field.key}/{part}"


def channel_column(f: FieldSpec, part: str, channel: int) -> str:
    """Column of the aggregated ``episode_stats`` table holding statistic ``part`` of one channel of ``f``."""
    return f"{stat_column(f, part)}/{channel}"


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


def episode_return(schema: DatasetSchema, data: Mapping[str, np.ndarray]) -> float | None:
    """The sum of the episode's rewards when the schema has one scalar numeric reward field, else None."""
    rewards = schema.role_fields("reward")
    if len(rewards) != 1 or rewards[0].np_dtype.kind not in "biuf" or rewards[0].shape != ():
        return None
    return float(data[rewards[0].key].sum(dtype=np.float64))


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


def split_channels(tbl: pa.Table, order: np.ndarray, fields: Iterable[FieldSpec]) -> dict[str, np.ndarray]:
    """The statistics columns of ``fields`` in ``tbl`` as flat arrays, rows taken in ``order``.

    ``stats/<key>/count`` stays one column; every list part becomes one
    contiguous column per channel (:func:`channel_column`). A part holding
    other than one value per channel and row raises :class:`CorruptionError`.
    """
    out: dict[str, np.ndarray] = {}
    for f in fields:
        out[stat_column(f, "count")] = tbl.column(stat_column(f, "count")).to_numpy()[order]
        channels = f.stat_channels
        for part in STAT_PARTS[1:]:
            col = tbl.column(stat_column(f, part)).combine_chunks()
            values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
            if col.null_count or values.size != tbl.num_rows * channels:
                raise CorruptionError(
                    f"field {f.key!r}: statistics {part!r} hold {values.size} values for {tbl.num_rows} "
                    f"episodes, expected {channels} per episode"
                )
            # one row gather into episode order, one transpose: each channel is then a contiguous row
            values = values.reshape(tbl.num_rows, channels)[order].T.copy()
            for c in range(channels):
                out[channel_column(f, part, c)] = values[c]
    return out


def _moments(name: str, n: str, total: str, sumsq: str, lo: str, hi: str) -> str:
    return sql_template("moments").substitute(name=name, n=n, sum=total, sumsq=sumsq, min=lo, max=hi)


def stats_sql(fields: Iterable[FieldSpec]) -> str:
    """The one aggregate (``sql/stats.sql``) computing every statistic of ``fields`` over ``episode_stats``."""
    parts = [
        _moments("length", "1", '"length"', '"length" * "length"', '"length"', '"length"'),
        _moments(
            "return", 'CAST("return" IS NOT NULL AS BIGINT)', '"return"', '"return" * "return"', '"return"', '"return"'
        ),
    ]
    for f in fields:
        for c in range(f.stat_channels):
            col = {p: quote(channel_column(f, p, c)) for p in STAT_PARTS[1:]}
            n = quote(stat_column(f, "count"))
            parts.append(_moments(f"{f.key}/{c}", n, col["sum"], col["sumsq"], col["min"], col["max"]))
    return sql_template("stats").substitute(moments=",\n".join(parts))


def aggregate(
    cur: duckdb.DuckDBPyConnection,
    columns: Mapping[str, np.ndarray | pa.Array],
    fields: list[FieldSpec],
    rows: np.ndarray | None = None,
) -> dict[str, dict[str, Any]]:
    """Count, sum, mean, population std, min and max of ``fields``, episode length and return.

    ``columns`` hold ``length``, ``return`` (Arrow: a NULL return is skipped)
    and :func:`split_channels` of ``fields``, one entry per episode; ``rows``
    picks the subset (None: all). Runs :func:`stats_sql` in ``cur``. Result
    shape: see :meth:`Dataset.stats`; an empty subset gives NaN.
    """
    wanted = ["length", "return"]
    for f in fields:
        wanted.append(stat_column(f, "count"))
        wanted += [channel_column(f, p, c) for p in STAT_PARTS[1:] for c in range(f.stat_channels)]
    if rows is None:
        taken = {n: columns[n] for n in wanted}
    else:
        taken = {n: _take(columns[n], rows) for n in wanted}
    cur.register("episode_stats", pa.table(taken))
    cur.execute(stats_sql(fields))
    [row] = cur.fetchall()  # an aggregate without GROUP BY: exactly one row
    values = dict(zip([d[0] for d in cur.description], row, strict=True))
    out: dict[str, dict[str, Any]] = {"episodes": {"count": int(values["episodes"])}}
    for name in ("length", "return"):
        out[name] = {m: _number(values[f"{name}/{m}"], m) for m in MOMENTS}
    for f in fields:
        per = {m: np.array([_number(values[f"{f.key}/{c}/{m}"], m) for c in range(f.stat_channels)]) for m in MOMENTS}
        entry: dict[str, Any] = {"count": int(per["count"][0])}
        for m in MOMENTS[1:]:
            vals = per[m].astype(np.float64)
            entry[m] = vals if f.channel_axis is not None else float(vals[0])
        out[f.key] = entry
    return out


def _take(column: np.ndarray | pa.Array, rows: np.ndarray) -> np.ndarray | pa.Array:
    return column.take(pa.array(rows)) if isinstance(column, pa.Array) else column[rows]


def _number(value: Any, moment: str) -> float | int:
    if moment == "count":
        return int(value or 0)
    return float("nan") if value is None else float(value)
