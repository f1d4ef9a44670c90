"""Commit batching: finished episodes wait in memory, then one table commit takes them all.

Contracts: a commit happens when ``commit_episodes`` episodes or
``commit_bytes`` payload bytes are pending, when ``commit_seconds`` passed since
the first pending episode finished (checked when an episode finishes), or on
``flush()``/``close()``/interpreter exit. Tensor rows are written before the
table commit that references them, so a crash loses only uncommitted
episodes. Each commit computes exact per-channel statistics and a CRC-32 per
episode and tensor field on the way.
"""

from __future__ import annotations

import atexit
import math
import os
import secrets
import time
import weakref
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .errors import ReadOnlyError
from .schema import DatasetSchema, FieldSpec, to_storage
from .table import STAT_PARTS, arrow_schema, has_stats, stat_column
from .tensors import TensorArray

if TYPE_CHECKING:
    from .dataset import Dataset


@dataclass
class FinishedEpisode:
    """A validated episode ready to commit: ``data[key]`` has T (or T+1 for obs) rows."""

    data: dict[str, np.ndarray]
    length: int
    terminated: bool
    truncated: bool
    meta: dict[str, Any]
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values())


_BLOCK = 256  # 8-bit values: float32 sums of <= 256 squares (<= 255**2 each) are exact
_PIECE_BYTES = 1 << 18  # rows summarized per step: stays in the CPU cache


def episode_stats(f: FieldSpec, values: np.ndarray) -> dict[str, Any]:
    """Mergeable statistics (exact) of ``values`` (rows of ``f``), per channel when the field has one."""
    axis = f.channel_axis
    channels = 1 if axis is None else f.shape[axis]
    if values.size == 0:
        return {"count": 0, "sum": None, "sumsq": None, "min": None, "max": None}
    moved = values if axis is None else np.moveaxis(values, axis + 1, 0)
    if values.dtype.itemsize == 1:
        # Images: float32 sums over blocks of 256 values are exact (every partial sum < 2**24).
        work = np.ascontiguousarray(moved, dtype=np.float32).reshape(channels, -1)
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


@np.errstate(invalid="ignore", over="ignore")  # inf/NaN data give inf/NaN stats, not warnings
def episode_summary(
    schema: DatasetSchema, e: FinishedEpisode, blocks: Mapping[str, np.ndarray], rows: Mapping[str, int]
) -> dict[str, Any]:
    """Copy ``e``'s tensor rows into the commit ``blocks`` at ``rows`` and summarize the episode.

    One cache-sized piece at a time is copied, checksummed and added to the
    statistics, so each byte is read from memory once. Runs in a thread pool
    (NumPy and zlib release the GIL).
    """
    out: dict[str, Any] = {"return": _episode_return(schema, e)}
    for f in schema.step_fields:
        values = e.data[f.key]
        stats = None
        if f.in_tensor:
            dest = blocks[f.key][rows[f.key] : rows[f.key] + len(values)]
            step = max(1, _PIECE_BYTES // max(1, values[:1].nbytes))
            crc = 0
            for i in range(0, len(values), step):
                piece = dest[i : i + step]
                piece[...] = values[i : i + step]
                crc = zlib.crc32(piece.data, crc)
                if has_stats(f):
                    stats = merge_stats(stats, episode_stats(f, piece))
            out[f"crc/{f.key}"] = crc
        elif has_stats(f):
            stats = episode_stats(f, values)
        if stats is not None:
            out[f"stats/{f.key}"] = stats
    return out


def _list_array(values: Sequence[np.ndarray], f: FieldSpec, typ: pa.DataType) -> pa.Array:
    """Nested Arrow list array for per-episode arrays (time + dims), built from flat values."""
    stored = [to_storage(v, f.np_dtype) for v in values]
    flat = pa.array(np.concatenate([s.reshape(-1) for s in stored]) if stored else np.array([]))
    shapes = [s.shape for s in stored]
    inner = stored[0].shape[1:] if stored else ()
    arr: pa.Array = flat
    for depth in range(len(inner), 0, -1):
        width = inner[depth - 1]
        count = sum(math.prod(s[:depth]) for s in shapes)
        arr = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32) * width), arr)
    lengths = np.array([s[0] for s in shapes], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), arr).cast(typ)


def build_rows(
    schema: DatasetSchema,
    episodes: Sequence[FinishedEpisode],
    summaries: Sequence[Mapping[str, Any]],
    writer: str,
    ids: Sequence[int],
    refs: Mapping[str, Sequence[int]],
) -> pa.Table:
    """The Arrow rows for a batch of finished episodes (in the table's schema)."""
    target = arrow_schema(schema)
    cols: dict[str, Any] = {
        "episode_id": pa.array(ids, pa.int64()),
        "writer": pa.array([writer] * len(episodes), pa.string()),
        "length": pa.array([e.length for e in episodes], pa.int64()),
        "terminated": pa.array([e.terminated for e in episodes], pa.bool_()),
        "truncated": pa.array([e.truncated for e in episodes], pa.bool_()),
        "return": pa.array([s["return"] for s in summaries], pa.float64()),
        "created_at": pa.array([e.created_at for e in episodes], pa.timestamp("us", tz="UTC")),
    }
    for f in schema.meta_fields:
        vals = [e.meta.get(f.name) for e in episodes]
        if f.np_dtype.kind == "U":
            cols[f.key] = pa.array(vals, pa.string())
        else:
            cols[f.key] = pa.array(
                [None if v is None else to_storage(np.asarray(v), f.np_dtype).tolist() for v in vals],
                target.field(f.key).type,
            )
    for f in schema.step_fields:
        if f.in_tensor:
            cols[f"ref/{f.key}"] = pa.array(refs[f.key], pa.int64())
            cols[f"crc/{f.key}"] = pa.array([s[f"crc/{f.key}"] for s in summaries], pa.int64())
        else:
            cols[f.key] = _list_array([e.data[f.key] for e in episodes], f, target.field(f.key).type)
        if has_stats(f):
            for part in STAT_PARTS:
                column = stat_column(f, part)
                values = [_plain(s[f"stats/{f.key}"][part]) for s in summaries]
                cols[column] = pa.array(values, target.field(column).type)
    return pa.table(cols, schema=target)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _episode_return(schema: DatasetSchema, e: FinishedEpisode) -> float | None:
    rewards = schema.role_fields("reward")
    if len(rewards) != 1 or rewards[0].np_dtype.kind not in "biuf" or rewards[0].shape != ():
        return None
    return float(e.data[rewards[0].key].sum(dtype=np.float64))


_POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="episodelake-stats")
_OPEN_SINKS: weakref.WeakSet[CommitSink] = weakref.WeakSet()


@atexit.register
def _flush_open_sinks() -> None:
    for sink in list(_OPEN_SINKS):
        sink.flush()


class CommitSink:
    """Owns one writer id, its tensor arrays and the pending (uncommitted) episodes.

    Episode ids are ``writer_number << 32 | sequence``: unique across
    concurrent writers without coordination (the 31-bit writer number is random
    and checked against the writers already in the table).
    """

    def __init__(
        self,
        ds: Dataset,
        commit_episodes: int = 64,
        commit_bytes: int = 256 << 20,
        commit_seconds: float = 30.0,
    ) -> None:
        if ds.read_only:
            raise ReadOnlyError(f"dataset {ds.location.url} is open read-only")
        self.ds = ds
        self.schema = ds.schema
        self.commit_episodes = commit_episodes
        self.commit_bytes = commit_bytes
        self.commit_seconds = commit_seconds
        taken = ds._writer_names()
        number = secrets.randbelow(1 << 31)
        while f"{number:08x}" in taken:
            number = secrets.randbelow(1 << 31)
        self.number = number
        self.name = f"{number:08x}"
        self.seq = 0
        self.pending: list[FinishedEpisode] = []
        self.pending_bytes = 0
        self.first_pending_at: float | None = None
        self.arrays: dict[str, TensorArray] = {}
        _OPEN_SINKS.add(self)

    def submit(self, episode: FinishedEpisode) -> None:
        if not self.pending:
            self.first_pending_at = time.monotonic()
        self.pending.append(episode)
        self.pending_bytes += episode.nbytes
        if (
            len(self.pending) >= self.commit_episodes
            or self.pending_bytes >= self.commit_bytes
            or time.monotonic() - (self.first_pending_at or 0.0) >= self.commit_seconds
        ):
            self.flush()

    def _array(self, f: FieldSpec) -> TensorArray:
        if f.key not in self.arrays:
            self.arrays[f.key] = TensorArray.create(self.ds.location, self.name, f, self.ds._ts_context)
        return self.arrays[f.key]

    def discard(self) -> int:
        """Forget the pending episodes; returns how many were dropped."""
        dropped = len(self.pending)
        self.pending = []
        self.pending_bytes = 0
        self.first_pending_at = None
        return dropped

    def flush(self) -> int | None:
        """Commit all pending episodes in one table commit; return the new version.

        Each tensor field's rows of the whole commit are gathered into one
        contiguous block (checksums and statistics computed on the way, in a
        thread pool); finished prefixes are written while later episodes are
        still summarized, in writes aligned to chunks (shards on object
        stores). The table commit happens only after every write completed.
        """
        if not self.pending:
            return None
        episodes = self.pending
        refs: dict[str, list[int]] = {}
        blocks: dict[str, np.ndarray] = {}
        for f in self.schema.tensor_fields:
            lengths = np.array([len(e.data[f.key]) for e in episodes], dtype=np.int64)
            refs[f.key] = (np.cumsum(lengths) - lengths).tolist()
            blocks[f.key] = np.empty((int(lengths.sum()), *f.shape), f.np_dtype)
        tasks = [
            _POOL.submit(episode_summary, self.schema, e, blocks, {k: r[i] for k, r in refs.items()})
            for i, e in enumerate(episodes)
        ]
        arrays = {f.key: self._array(f) for f in self.schema.tensor_fields}
        base = {k: arr.reserve(len(blocks[k])) for k, arr in arrays.items()}
        done = dict.fromkeys(arrays, 0)
        writes = []
        summaries = []
        for i, task in enumerate(tasks):
            summaries.append(task.result())
            # Write each finished prefix up to its last write-unit boundary while later
            # episodes are still summarized: aligned writes never share a chunk.
            for k, arr in arrays.items():
                unit = arr.write_rows
                end = (base[k] + refs[k][i] + len(episodes[i].data[k])) // unit * unit - base[k]
                if i == len(tasks) - 1:
                    end = len(blocks[k])
                if end > done[k]:
                    writes.append(arr.write(base[k] + done[k], blocks[k][done[k] : end]))
                    done[k] = end
        for k in arrays:
            refs[k] = [base[k] + r for r in refs[k]]
        for w in writes:
            w.result()
        ids = [(self.number << 32) | (self.seq + i) for i in range(len(episodes))]
        rows = build_rows(self.schema, episodes, summaries, self.name, ids, refs)
        version = self.ds._table.append(rows)
        self.seq += len(episodes)
        self.discard()
        self.ds._on_commit()
        return version
