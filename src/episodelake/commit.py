"""Commit batching: finished episodes wait in memory, then one table commit takes them all.

Contracts:

* A commit happens when ``commit_episodes`` episodes or ``commit_bytes``
  payload bytes are pending, when ``commit_seconds`` passed since the first
  pending episode finished (checked when an episode finishes), before any read
  of the writing :class:`Dataset` (reads commit first), on
  ``flush()``/``close()``, and at interpreter exit: a normal exit, an uncaught
  exception or ``KeyboardInterrupt``, whether or not the dataset object is
  still referenced. The exit commit runs before ``concurrent.futures`` shuts
  its pools down (``threading`` exit hook) and summarizes inline if a pool
  refuses work anyway. Only the process that created a sink commits it (a
  forked child never commits its parent's episodes).
* Tensor rows are written before the table commit that references them, so a
  crash (SIGKILL) loses only uncommitted episodes. Ctrl-C during a commit is
  deferred until the commit is recorded, so no episode is committed twice.
* Episodes waiting for ``required`` meta fields (held by their writer) are
  never committed: ``flush()`` raises :class:`ValidationError` naming them and
  commits nothing; at exit each is named in one line on stderr.
* Each commit computes exact per-channel statistics and a CRC-32 per episode
  and tensor field on the way.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import secrets
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from .episode import FinishedEpisode
from .errors import EpisodeStateError, ReadOnlyError, ValidationError
from .schema import DatasetSchema, FieldSpec, to_storage
from .stats import STAT_PARTS, episode_return, episode_stats, has_stats, merge_stats, stat_column
from .store import Store
from .table import arrow_schema
from .tensors import TensorArray


class HeldEpisode(Protocol):
    """An ended episode its writer holds until its required meta arrive (an ``EpisodeWriter``)."""

    def discard(self) -> None:
        """Drop the episode; it is never stored."""


_PIECE_BYTES = 1 << 18  # rows summarized per step: stays in the CPU cache


@np.errstate(invalid="ignore", over="ignore")  # inf/NaN data give inf/NaN stats, not warnings
def episode_summary(
    schema: DatasetSchema, e: FinishedEpisode, blocks: Mapping[str, np.ndarray], rows: Mapping[str, int]
) -> dict[str, Any]:
    """Copy ``e``'s tensor rows into the commit ``blocks`` at ``rows`` and summarize the episode.

    One cache-sized piece at a time is copied, checksummed and added to the
    statistics, so each byte is read from memory once. Runs in a thread pool
    (NumPy and zlib release the GIL).
    """
    out: dict[str, Any] = {"return": episode_return(schema, e.data)}
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


_POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="episodelake-stats")
# Sinks holding uncommitted episodes, strongly referenced so that they commit at exit even when
# the user dropped the Dataset (e.g. a local of a function that returned).
_LIVE: set[CommitSink] = set()


def _submit(fn: Callable[..., Any], *args: Any) -> Future:
    """Run ``fn`` in the pool, or inline when the pool refuses (interpreter shutdown)."""
    try:
        return _POOL.submit(fn, *args)
    except RuntimeError:
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done


@contextlib.contextmanager
def _defer_sigint() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block ends, then raise KeyboardInterrupt.

    A KeyboardInterrupt between the table append and forgetting the pending
    episodes would commit them a second time at exit. Only the main thread
    receives signals, and a custom SIGINT handler is left alone.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a CommitSink method under the sink's lock (reads in other threads commit too)."""

    @functools.wraps(method)
    def run(self: CommitSink, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return run


def _commit_at_exit() -> None:
    """Commit every live sink of this process; name the episodes that still await required meta."""
    for sink in list(_LIVE):
        if sink.pid != os.getpid() or sink.store.location.ephemeral:
            continue  # a forked child's copy, or an in-memory dataset that vanishes now anyway
        for writer in sink.awaiting:
            print(
                f"episodelake: not committed at exit: {writer!r} (required meta missing) in {sink.store.location.url}",
                file=sys.stderr,
            )
        try:
            sink.commit()
        except Exception as exc:  # one failing dataset must not keep the others from committing
            print(f"episodelake: commit at exit failed for {sink.store.location.url}: {exc!r}", file=sys.stderr)


# threading's exit hooks run before concurrent.futures shuts its pools down (atexit runs after).
_register = getattr(threading, "_register_atexit", atexit.register)
_register(_commit_at_exit)


class CommitSink:
    """Owns one writer id, its tensor arrays and the pending (uncommitted) episodes.

    Episode ids are ``writer_number << 32 | sequence``: unique across
    concurrent writers without coordination (the 31-bit writer number is random
    and checked against the writers already in the table).
    """

    def __init__(
        self,
        store: Store,
        commit_episodes: int = 64,
        commit_bytes: int = 256 << 20,
        commit_seconds: float = 30.0,
    ) -> None:
        if store.read_only:
            raise ReadOnlyError(f"dataset {store.location.url} is open read-only")
        self.store = store
        self.schema = store.schema
        self.commit_episodes = commit_episodes
        self.commit_bytes = commit_bytes
        self.commit_seconds = commit_seconds
        taken = store.writer_names()
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
        self.awaiting: list[HeldEpisode] = []  # finished, held by their writer until required meta arrive
        self.pid = os.getpid()
        self.lock = threading.RLock()

    def _check_process(self) -> None:
        if os.getpid() != self.pid:
            raise EpisodeStateError(
                f"this episode's writer belongs to process {self.pid}; in a forked process start new episodes"
            )

    def _update_live(self) -> None:
        if self.pending or self.awaiting:
            _LIVE.add(self)
        else:
            _LIVE.discard(self)

    @_locked
    def hold(self, writer: HeldEpisode) -> None:
        """Register a finished episode that waits for required meta (it blocks ``flush()``)."""
        self._check_process()
        self.awaiting.append(writer)
        self._update_live()

    @_locked
    def release(self, writer: HeldEpisode) -> None:
        """Forget a held episode (its meta arrived, or it was discarded)."""
        self.awaiting = [w for w in self.awaiting if w is not writer]
        self._update_live()

    @_locked
    def submit(self, episode: FinishedEpisode) -> None:
        """Queue a finished episode; commits when a size/count/age trigger fires."""
        self._check_process()
        if not self.pending:
            self.first_pending_at = time.monotonic()
        self.pending.append(episode)
        self.pending_bytes += episode.nbytes
        if (
            len(self.pending) >= self.commit_episodes
            or self.pending_bytes >= self.commit_bytes
            or time.monotonic() - (self.first_pending_at or 0.0) >= self.commit_seconds
        ):
            self.commit()
        self._update_live()

    def _array(self, f: FieldSpec) -> TensorArray:
        if f.key not in self.arrays:
            self.arrays[f.key] = self.store.new_array(self.name, f)
        return self.arrays[f.key]

    @_locked
    def discard(self) -> int:
        """Forget the pending episodes and those awaiting meta; returns how many were dropped."""
        dropped = len(self.pending) + len(self.awaiting)
        for writer in list(self.awaiting):
            writer.discard()
        self._forget_pending()
        return dropped

    def _forget_pending(self) -> None:
        self.pending = []
        self.pending_bytes = 0
        self.first_pending_at = None
        self._update_live()

    @_locked
    def flush(self) -> int | None:
        """Commit all pending episodes; :class:`ValidationError` (committing nothing) if any awaits meta."""
        if self.awaiting:
            held = "; ".join(repr(w) for w in self.awaiting)
            raise ValidationError(
                f"{len(self.awaiting)} finished episode(s) still miss required meta: {held}; set it "
                "(writer.meta[name] = value or writer.set_meta(...)) or discard them; nothing was committed"
            )
        return self.commit()

    @_locked
    def commit(self) -> int | None:
        """Commit all pending episodes in one table commit; return the new version (None if none).

        Each tensor field's rows of the whole commit are gathered into one
        contiguous block (checksums and statistics computed on the way, in a
        thread pool); finished prefixes are written while later episodes are
        still summarized, in writes aligned to chunks (shards on object
        stores). The table commit happens only after every write completed.
        """
        if not self.pending:
            return None
        self._check_process()
        with _defer_sigint():
            return self._commit(self.pending)

    def _commit(self, episodes: list[FinishedEpisode]) -> int:
        refs: dict[str, list[int]] = {}
        blocks: dict[str, np.ndarray] = {}
        for f in self.schema.tensor_fields:
            lengths = np.array([len(e.data[f.key]) for e in episodes], dtype=np.int64)
            refs[f.key] = (np.cumsum(lengths) - lengths).tolist()
            blocks[f.key] = np.empty((int(lengths.sum()), *f.shape), f.np_dtype)
        tasks = [
            _submit(episode_summary, self.schema, e, blocks, {k: r[i] for k, r in refs.items()})
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
        version = self.store.table.append(rows)
        self.seq += len(episodes)
        self._forget_pending()
        self.store.committed()
        return version
