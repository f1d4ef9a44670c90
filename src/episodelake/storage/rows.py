"""Table-row encoding: finished episodes, per-episode and per-step values as Arrow columns of the episode table.

The one encoding both the write path (commits, derived columns) and copies use;
reads decode what it writes (``schema.from_storage``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.episode import EpisodeBatch
from ..core.schema import DatasetSchema, FieldSpec, to_storage
from ..core.stats import STAT_PARTS, has_stats, stat_column
from ..core.summary import BatchSummary
from .table import QUARANTINED, arrow_schema

# The quality columns (write/gate.py): the quarantine and warn checks an episode failed at its commit, and whether
# it is quarantined. A table has them from the first commit that needs them (a schema merge); older rows read NULL.
CHECKS_FAILED = "checks_failed"
QUALITY_COLUMNS = pa.schema([(CHECKS_FAILED, pa.list_(pa.string())), (QUARANTINED, pa.bool_())])


def quality_columns(failed: tuple[tuple[tuple[str, ...], bool], ...] | None, n: int) -> dict[str, pa.Array]:
    """The quality columns of ``n`` episodes (``EpisodeBatch.failed``; None: none failed)."""
    items = failed or (((), False),) * n
    return {
        CHECKS_FAILED: pa.array([list(names) for names, _ in items], QUALITY_COLUMNS.field(CHECKS_FAILED).type),
        QUARANTINED: pa.array([held for _, held in items], pa.bool_()),
    }


def _nested(stored: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    """One Arrow value per row of ``stored`` (``[rows, *dims]``): nested fixed-width lists over ``dims``.

    ``null`` (bool per row) marks the rows that are NULL.
    """
    dims = stored.shape[1:]
    if not dims:
        return pa.array(stored, mask=null)
    arr: pa.Array = pa.array(stored.reshape(-1))
    for depth in range(len(dims), 0, -1):
        lists = len(stored) * math.prod(dims[: depth - 1])
        offsets = pa.array(np.arange(lists + 1, dtype=np.int32) * dims[depth - 1])
        mask = pa.array(null) if depth == 1 and null is not None else None
        arr = pa.ListArray.from_arrays(offsets, arr, mask=mask)
    return arr


def step_column(f: FieldSpec, values: np.ndarray, starts: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A table per-step column: one list of rows per episode (episode ``i``: rows ``starts[i]:starts[i+1]``)."""
    rows = _nested(to_storage(values, f.np_dtype))
    return pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), rows).cast(typ)


def meta_column(f: FieldSpec, values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A meta column: one value per episode, NULL where not ``valid``."""
    if f.np_dtype.kind == "U":
        return pa.array(values, pa.string(), mask=~valid)
    return _nested(to_storage(values, f.np_dtype), ~valid).cast(typ)


def stat_columns(f: FieldSpec, parts: Mapping[str, np.ndarray], target: pa.Schema) -> dict[str, pa.Array]:
    """The ``stats/<key>/<part>`` columns from per-episode parts (``count`` [n], the others [n, channels])."""
    n = len(parts["count"])
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * f.stat_channels)
    out: dict[str, pa.Array] = {stat_column(f, "count"): pa.array(parts["count"], pa.int64())}
    for part in STAT_PARTS[1:]:
        column = stat_column(f, part)
        values = pa.array(np.ascontiguousarray(parts[part], dtype=np.float64).reshape(-1))
        out[column] = pa.ListArray.from_arrays(offsets, values).cast(target.field(column).type)
    return out


def build_rows(
    schema: DatasetSchema,
    batch: EpisodeBatch,
    summary: BatchSummary,
    writer: str,
    ids: np.ndarray,
    refs: Mapping[str, np.ndarray],
    quality: bool = False,
) -> pa.Table:
    """The Arrow rows for a batch of finished episodes (in the table's schema), built column by column.

    ``quality``: with the :data:`QUALITY_COLUMNS` last (the table has them, or this batch needs them).
    Fields ``summary`` leaves out (``summarize(keys=)``) have NULL checksum and statistics columns.
    """
    target = arrow_schema(schema)
    n = len(batch)
    returns = summary.returns
    cols: dict[str, Any] = {
        "episode_id": pa.array(ids, pa.int64()),
        "writer": pa.array([writer] * n, pa.string()),
        "length": pa.array(batch.lengths, pa.int64()),
        "terminated": pa.array(batch.terminated, pa.bool_()),
        "truncated": pa.array(batch.truncated, pa.bool_()),
        "return": pa.array(returns, pa.float64()) if returns is not None else pa.nulls(n, pa.float64()),
        "created_at": pa.array(batch.created_at.astype("datetime64[us]"), pa.timestamp("us", tz="UTC")),
    }
    for f in schema.meta_fields:
        values, valid = batch.meta[f.name]
        cols[f.key] = meta_column(f, values, valid, target.field(f.key).type)
    for f in schema.step_fields:
        if f.in_tensor:
            cols[f"ref/{f.key}"] = pa.array(refs[f.key], pa.int64())
            crc = summary.crc.get(f.key)
            cols[f"crc/{f.key}"] = pa.nulls(n, pa.int64()) if crc is None else pa.array(crc, pa.int64())
        else:
            cols[f.key] = step_column(f, batch.data[f.key], batch.row_starts(f), target.field(f.key).type)
        if has_stats(f) and f.key in summary.stats:
            cols.update(stat_columns(f, summary.stats[f.key], target))
        elif has_stats(f):
            cols.update({c: pa.nulls(n, target.field(c).type) for c in (stat_column(f, p) for p in STAT_PARTS)})
    if quality:
        cols.update(quality_columns(batch.failed, n))
        target = pa.unify_schemas([target, QUALITY_COLUMNS])
    return pa.table(cols, schema=target)
