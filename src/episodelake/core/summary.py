"""Per-episode summaries of a whole batch at once: CRC-32s, exact statistics and returns.

Vectorized over episodes, so a batch of a million tiny episodes costs a
handful of NumPy calls per field, not Python per episode:

* statistics (the parts of :func:`stats.episode_stats`, same channels): for
  episodes larger than a window, :func:`stats.episode_stats` of each
  episode's cache-sized pieces, merged; otherwise a field's rows are cut
  into cache-sized windows; in each window one
  ``reduceat`` per part gives the partial statistics of every episode piece
  in it, and the pieces of episodes that span windows are merged (sums add,
  min/max combine), which is exact for the same reason :func:`merge_stats`
  is. Values are summed in float64 (8-bit images too: every partial sum of
  squares of a window is an exact integer far below 2**53).
* CRC-32 of each episode's rows of each tensor field (its contiguous bytes).
* the return: the sum of the scalar reward field per episode, in float64.

Work is split into tasks of about :data:`TASK_BYTES` that the caller may run
in a thread pool (NumPy and zlib release the GIL).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .episode import EpisodeBatch
from .schema import DatasetSchema, FieldSpec
from .stats import STAT_PARTS, episode_stats, has_stats, merge_stats, return_field

WINDOW_BYTES = 1 << 18  # source bytes reduced per NumPy call: the float64 copy stays in the CPU cache
TASK_BYTES = 1 << 22  # source bytes per task handed to the pool

Runner = Callable[[Sequence[Callable[[], Any]]], list[Any]]


def run_inline(tasks: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``tasks`` one after the other in this thread."""
    return [task() for task in tasks]


@dataclass
class BatchSummary:
    """What the table stores about each episode of a batch besides its values."""

    returns: np.ndarray | None  # float64 [n]; None when the schema has no scalar numeric reward field
    crc: dict[str, np.ndarray] = field(default_factory=dict)  # tensor field key -> int64 [n]
    # field key -> {"count": int64 [n], "sum"/"sumsq"/"min"/"max": float64 [n, channels]}
    stats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def summarize(
    schema: DatasetSchema, batch: EpisodeBatch, run: Runner = run_inline, keys: Collection[str] | None = None
) -> BatchSummary:
    """CRC-32s (tensor fields), statistics (numeric step fields) and returns of every episode of ``batch``.

    ``keys``: only these step fields get CRC-32s and statistics (None: all); the quality gate summarizes
    only what its checks name.
    """
    tasks: list[Callable[[], Any]] = []
    plan: list[tuple[str, FieldSpec, int]] = []  # (kind, field, number of tasks)
    for f in schema.step_fields:
        if keys is not None and f.key not in keys:
            continue
        values = batch.data[f.key]
        starts = batch.row_starts(f)
        row_bytes = max(1, values[:1].nbytes)
        if f.in_tensor:
            ranges = _episode_ranges(starts, max(1, TASK_BYTES // row_bytes))
            tasks += [partial(_crcs, values, starts, a, b) for a, b in ranges]
            plan.append(("crc", f, len(ranges)))
        if has_stats(f):
            if len(values) * row_bytes >= len(batch) * WINDOW_BYTES:  # large episodes: one by one, piecewise
                spans = _episode_ranges(starts, max(1, TASK_BYTES // row_bytes))
                tasks += [partial(_episode_stats, f, values, starts, a, b) for a, b in spans]
            else:  # many small episodes: vectorized over episodes, window by window
                step = max(1, TASK_BYTES // row_bytes)
                spans = [(r, min(r + step, len(values))) for r in range(0, len(values), step)]
                tasks += [partial(_window_stats, f, values, starts, a, b) for a, b in spans]
            plan.append(("stats", f, len(spans)))
    results = iter(run(tasks))
    out = BatchSummary(_returns(schema, batch))
    for kind, f, count in plan:
        parts = [next(results) for _ in range(count)]
        if kind == "crc":
            out.crc[f.key] = np.concatenate(parts)
        else:
            out.stats[f.key] = _merge_pieces(f, batch, parts)
    return out


def _episode_ranges(starts: np.ndarray, rows: int) -> list[tuple[int, int]]:
    """Consecutive episode ranges ``[a, b)`` of about ``rows`` rows each (at least one episode)."""
    n = len(starts) - 1
    out = []
    a = 0
    while a < n:
        b = max(a + 1, int(np.searchsorted(starts, starts[a] + rows, side="right")) - 1)
        b = min(b, n)
        out.append((a, b))
        a = b
    return out


def _crcs(values: np.ndarray, starts: np.ndarray, a: int, b: int) -> np.ndarray:
    """CRC-32 of the bytes of episodes ``a..b-1``'s rows."""
    flat = np.ascontiguousarray(values).reshape(-1).view(np.uint8).data
    offsets = starts[a : b + 1] * max(1, values[:1].nbytes)
    return np.array(
        [zlib.crc32(flat[lo:hi]) for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)],
        dtype=np.int64,
    )


@np.errstate(invalid="ignore", over="ignore")  # inf/NaN data give inf/NaN statistics, not warnings
def _window_stats(
    f: FieldSpec, values: np.ndarray, starts: np.ndarray, r0: int, r1: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Partial statistics of the episode pieces in rows ``[r0, r1)``: (each piece's episode, [sum, sumsq, min, max])."""
    window = max(1, WINDOW_BYTES // max(1, values[:1].nbytes))
    episodes, pieces = [], []
    for w0 in range(r0, r1, window):
        w1 = min(w0 + window, r1)
        first = int(np.searchsorted(starts, w0, side="right")) - 1
        last = int(np.searchsorted(starts, w1, side="left")) - 1
        cuts = np.concatenate([[0], starts[first + 1 : last + 1] - w0])
        rows = _by_channel(f, values[w0:w1])  # [rows, channels, elements]
        if rows.shape[2] == 1:
            total = lo = hi = rows[:, :, 0]
            squares = total * total
        else:
            total, lo, hi = rows.sum(axis=2), rows.min(axis=2), rows.max(axis=2)
            squares = np.einsum("rck,rck->rc", rows, rows)
        episodes.append(np.arange(first, last + 1))
        pieces.append(
            [
                np.add.reduceat(total, cuts),
                np.add.reduceat(squares, cuts),
                np.minimum.reduceat(lo, cuts),
                np.maximum.reduceat(hi, cuts),
            ]
        )
    return np.concatenate(episodes), [np.concatenate(p) for p in zip(*pieces, strict=True)]


def _episode_stats(
    f: FieldSpec, values: np.ndarray, starts: np.ndarray, a: int, b: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Statistics of episodes ``a..b-1``, each from :func:`stats.episode_stats` of its cache-sized pieces."""
    window = max(1, WINDOW_BYTES // max(1, values[:1].nbytes))
    parts: list[list[np.ndarray]] = [[], [], [], []]
    for e in range(a, b):
        merged = None
        for r in range(int(starts[e]), int(starts[e + 1]), window):
            merged = merge_stats(merged, episode_stats(f, values[r : min(r + window, int(starts[e + 1]))]))
        assert merged is not None  # every episode has rows
        for out, part in zip(parts, STAT_PARTS[1:], strict=True):
            out.append(merged[part])
    return np.arange(a, b), [np.array(p, dtype=np.float64) for p in parts]


def _by_channel(f: FieldSpec, rows: np.ndarray) -> np.ndarray:
    """``rows`` as float64 ``[rows, channels, elements per channel]`` (channels as :func:`episode_stats`)."""
    axis = f.channel_axis
    moved = rows if axis is None else np.moveaxis(rows, axis + 1, 1)
    return np.asarray(moved, dtype=np.float64).reshape(len(rows), f.stat_channels, -1)


def _merge_pieces(
    f: FieldSpec, batch: EpisodeBatch, results: list[tuple[np.ndarray, list[np.ndarray]]]
) -> dict[str, np.ndarray]:
    """Every episode's statistics from the pieces of all windows (an episode's pieces are consecutive)."""
    episodes = np.concatenate([r[0] for r in results])
    parts = [np.concatenate(p) for p in zip(*(r[1] for r in results), strict=True)]
    if len(episodes) != len(batch):  # some episodes span windows: merge their pieces
        heads = np.flatnonzero(np.concatenate([[True], episodes[1:] != episodes[:-1]]))
        parts = [
            np.add.reduceat(parts[0], heads),
            np.add.reduceat(parts[1], heads),
            np.minimum.reduceat(parts[2], heads),
            np.maximum.reduceat(parts[3], heads),
        ]
    per_row = int(np.prod(f.shape, dtype=np.int64)) // f.stat_channels
    count = (batch.row_starts(f)[1:] - batch.row_starts(f)[:-1]) * per_row
    return {"count": count, "sum": parts[0], "sumsq": parts[1], "min": parts[2], "max": parts[3]}


@np.errstate(invalid="ignore", over="ignore")
def _returns(schema: DatasetSchema, batch: EpisodeBatch) -> np.ndarray | None:
    """Per-episode sums of the reward field of :func:`stats.return_field` (None: the schema has no return)."""
    f = return_field(schema)
    if f is None:
        return None
    # every episode has at least one step, so no two starts coincide (reduceat's empty-range rule)
    return np.add.reduceat(batch.data[f.key].astype(np.float64), batch.row_starts(f)[:-1])
