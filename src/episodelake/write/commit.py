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
* A storage fault (full disk, read-only file system, permission denied, an
  unreachable store) raises :class:`StorageError` naming the dataset, the
  object and the cause, chained to the library's own error; the episodes stay
  pending (nothing of the failed commit is visible) and a later commit takes
  them. A writer is refused at once on a local file system mounted read-only
  or not writable. A commit that fails at exit prints one line on stderr
  naming the episodes that were not committed and why (the exit status is the
  script's own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from ..core import lifecycle
from ..core.episode import EpisodeBatch, FinishedEpisode, batch_of, concat_batches
from ..core.errors import EpisodeLakeError, EpisodeStateError, SchemaError, StorageError, ValidationError
from ..core.schema import FieldSpec
from ..core.summary import TASK_BYTES, run_inline, summarize
from ..storage.arrays import array_parts
from ..storage.faults import clean_text, storage_fault
from ..storage.frames import FrameArray
from ..storage.rows import QUARANTINED, build_rows
from ..storage.store import Store
from ..storage.table import rows_token
from ..storage.tensors import TensorArray
from .gate import admit, gated


class HeldEpisode(Protocol):
    """An ended episode its writer holds until its required meta arrive (an ``EpisodeWriter``)."""

    def discard(self) -> None:
        """Drop the episode; it is never stored."""


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


def run_pooled(tasks: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``tasks`` in the pool (inline when it refuses work) and return their results in order."""
    futures = [_submit(task) for task in tasks]
    return [f.result() for f in futures]


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
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # one failing dataset must not keep the others from committing
            # BaseException: deltalake's Rust panics arrive as pyo3's PanicException, a BaseException
            # One line, no traceback: which episodes are lost and why (a StorageError says it in plain words).
            why = clean_text(str(exc) if isinstance(exc, EpisodeLakeError) else f"{type(exc).__name__}: {exc}")
            line = f"episodelake: not committed at exit: {sink.describe_pending()}: {why}"
            print(" ".join(line.split()), file=sys.stderr)


lifecycle.on_exit("commit", _commit_at_exit)  # a threading-exit stage: the summaries still use the pools


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
        store.check_writable()
        _check_writable(store)
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
        self.pending: list[FinishedEpisode | EpisodeBatch] = []  # step episodes, and the rest of bulk calls
        self.pending_count = 0  # episodes in ``pending``
        self.pending_bytes = 0
        self.first_pending_at: float | None = None
        self.generation = 0  # moves whenever the pending episodes are committed or dropped (see preview)
        self.arrays: dict[str, TensorArray | FrameArray] = {}
        self.awaiting: list[HeldEpisode] = []  # finished, held by their writer until required meta arrive
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.in_doubt: InDoubt | None = None  # a commit whose outcome a storage fault left unknown

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
    def submit(self, episode: FinishedEpisode, label: str = "the episode") -> None:
        """Queue a finished episode that passed the quality gate; commits when a size/count/age trigger fires.

        A constraint or ``reject`` check it fails raises :class:`QualityError` (``label`` names the
        episode) and queues nothing.
        """
        if gated(self.store):
            self.submit_many(admit(self.store, batch_of(self.schema, [episode]), lambda i: label))
        else:
            self.submit_many([episode])

    @_locked
    def submit_many(self, episodes: Sequence[FinishedEpisode] | EpisodeBatch) -> None:
        """Queue finished episodes (or a validated batch past its quality gate); commit all pending ones if a
        trigger fired."""
        self._check_process()
        if not len(episodes):
            return
        if not self.pending:
            self.first_pending_at = time.monotonic()
        if isinstance(episodes, EpisodeBatch):
            self.pending.append(episodes)
            self.pending_bytes += episodes.nbytes
        else:
            self.pending.extend(episodes)
            self.pending_bytes += sum(e.nbytes for e in episodes)
        self.pending_count += len(episodes)
        if self.due(0, 0):
            self.commit()
        self._update_live()

    def due(self, episodes: int, nbytes: int) -> bool:
        """Whether the pending episodes plus ``episodes`` more (``nbytes``) fire a commit trigger."""
        return (
            self.pending_count + episodes >= self.commit_episodes
            or self.pending_bytes + nbytes >= self.commit_bytes
            or (self.first_pending_at is not None and time.monotonic() - self.first_pending_at >= self.commit_seconds)
        )

    def _array(self, f: FieldSpec) -> TensorArray | FrameArray:
        if f.key not in self.arrays:
            self.arrays[f.key] = self.store.new_array(self.name, f)
        return self.arrays[f.key]

    def describe_pending(self) -> str:
        """The pending episodes in words: how many, the dataset and writer, each one's length and meta."""
        batch = self._pending_batch()
        shown = []
        for i in range(min(len(batch), _NAMED_AT_EXIT)):
            meta = {
                name: values[i].tolist() if hasattr(values[i], "tolist") else values[i]
                for name, (values, valid) in batch.meta.items()
                if valid[i]
            }
            shown.append(f"{int(batch.lengths[i])} steps {meta}")
        more = f", and {len(batch) - len(shown)} more" if len(batch) > len(shown) else ""
        return (
            f"{len(batch)} finished episode(s) of writer {self.name} in {self.store.location.url} "
            f"({'; '.join(shown)}{more})"
        )

    @_locked
    def discard(self) -> int:
        """Forget the pending episodes and those awaiting meta; returns how many were dropped."""
        dropped = self.pending_count + len(self.awaiting)
        for writer in list(self.awaiting):
            writer.discard()
        self._forget_pending()
        return dropped

    def _forget_pending(self) -> None:
        if self.in_doubt is not None:  # dropped: a commit found landed later takes none of the new pending ones
            self.in_doubt = dataclasses.replace(self.in_doubt, queued=0)
        self.pending = []
        self.pending_count = 0
        self.pending_bytes = 0
        self.first_pending_at = None
        self.generation += 1
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
        contiguous block and written in one TensorStore write while checksums
        and statistics are computed (vectorized over episodes, in a thread
        pool). The table commit happens only after every write completed.
        """
        if not self.pending:
            return None
        self._check_process()
        with _defer_sigint():
            version = self.settle()
            if not self.pending:  # every pending episode was in the commit that landed
                return version
            return self._commit(self._pending_batch())

    @_locked
    def commit_batch(self, batch: EpisodeBatch) -> int:
        """Commit the pending episodes and then the validated ``batch`` in one table commit; return the version.

        The bulk path (``append_episodes``, importers): the caller bounds the
        batch's size; nothing of it is visible unless the whole commit lands.
        """
        self._check_process()
        with _defer_sigint():
            self.settle()
            queued = [self._pending_batch()] if self.pending else []
            return self._commit(concat_batches(self.schema, [*queued, batch]), len(batch))

    @_locked
    def preview(self, held: tuple[int, int] | None) -> tuple[tuple[int, int], tuple[EpisodeBatch, np.ndarray] | None]:
        """What a reader of the pending episodes lacks, taken at one instant.

        ``held``: the ``(generation, count)`` this returned before (None:
        nothing read). Returns ``(generation, count)`` now and the pending
        episodes after the first ``held[1]`` (all of them when ``held`` is
        of another generation) as one batch with the ids their commit gives
        them (None: none). Exact while :attr:`generation` stays the same: a
        commit takes every pending episode and numbers them in the order
        they were queued.
        """
        now = (self.generation, self.pending_count)
        if held == now:  # the common case of a stream polling between episodes: nothing new
            return now, None
        skip = held[1] if held is not None and held[0] == self.generation else 0
        items: list[FinishedEpisode | EpisodeBatch] = []
        seen = 0
        for item in self.pending:
            n = 1 if isinstance(item, FinishedEpisode) else len(item)
            if seen + n > skip:
                if seen < skip:
                    assert isinstance(item, EpisodeBatch)  # one FinishedEpisode is never cut
                    item = item.take(self.schema.step_fields, skip - seen, n)
                items.append(item)
            seen += n
        if not items:
            return now, None
        batch = self._as_batch(items)
        first = self.seq + skip
        return now, (batch, (self.number << 32) | np.arange(first, first + len(batch), dtype=np.int64))

    def _pending_batch(self) -> EpisodeBatch:
        """The pending episodes as one batch, in the order they were queued."""
        return self._as_batch(self.pending)

    def _as_batch(self, items: Sequence[FinishedEpisode | EpisodeBatch]) -> EpisodeBatch:
        parts: list[EpisodeBatch] = []
        run: list[FinishedEpisode] = []
        for item in items:
            if isinstance(item, FinishedEpisode):
                run.append(item)
                continue
            if run:
                parts.append(batch_of(self.schema, run))
                run = []
            parts.append(item)
        if run:
            parts.append(batch_of(self.schema, run))
        return concat_batches(self.schema, parts)

    @_locked
    def settle(self) -> int | None:
        """Resolve the commit whose outcome a storage fault left unknown, before anything else is committed.

        Did a commit carrying its token land after the version it read? Yes:
        its episodes count as committed (their ids are taken, the pending ones
        it held are no longer pending) and the version it landed in or after
        is returned; no: nothing changes (its episodes stay pending) and None
        is returned, as when no outcome is unknown. A log that cannot be read
        raises :class:`StorageError` and the outcome stays unknown, so no
        episode is ever committed twice, whatever the next batch holds.
        """
        doubt = self.in_doubt
        if doubt is None:
            return None
        try:
            landed = self.store.table.find_commit(doubt.token, doubt.since)
        except Exception as exc:
            err = storage_fault(
                exc,
                dataset=self.store.location.url,
                object=self.store.location.delta_uri(),
                doing=f"finding out whether the commit of {doubt.episodes} episode(s) that failed landed",
                endpoint=self.store.location.endpoint,
            )
            if err is None:
                raise
            raise err from exc
        self.in_doubt = None
        if not landed:
            return None
        self.seq += doubt.episodes
        rest = self._drop_queued(doubt.queued)
        self.pending = []
        self.pending_count = 0
        self.pending_bytes = 0
        self.generation += 1
        if rest:
            self.first_pending_at = time.monotonic()
            for item in rest:
                self.pending.append(item)
                self.pending_count += 1 if isinstance(item, FinishedEpisode) else len(item)
                self.pending_bytes += item.nbytes
        else:
            self.first_pending_at = None
        self._update_live()
        self.store.committed()
        return self.store.version

    def _drop_queued(self, count: int) -> list[FinishedEpisode | EpisodeBatch]:
        """The pending items after the first ``count`` episodes (a bulk batch cut where they end)."""
        rest: list[FinishedEpisode | EpisodeBatch] = []
        seen = 0
        for item in self.pending:
            n = 1 if isinstance(item, FinishedEpisode) else len(item)
            if seen >= count:
                rest.append(item)
            elif seen + n > count:
                assert isinstance(item, EpisodeBatch)  # one FinishedEpisode is never cut
                rest.append(item.take(self.schema.step_fields, count - seen, n))
            seen += n
        return rest

    def _commit(self, batch: EpisodeBatch, extra: int = 0) -> int:
        """Commit ``batch``: the pending episodes, then ``extra`` more of a bulk call (not pending)."""
        where = [""]  # the object being written, for the error of a storage fault
        try:
            return self._write(batch, where, extra)
        except Exception as exc:
            err = storage_fault(
                exc,
                dataset=self.store.location.url,
                object=where[0],
                doing=f"committing {len(batch)} episode(s)",
                endpoint=self.store.location.endpoint,
            )
            if err is None:
                raise
            raise err from exc  # the episodes stay pending: nothing of this commit is referenced

    def _write(self, batch: EpisodeBatch, where: list[str], extra: int = 0) -> int:
        if self.schema is not self.store.schema:  # a schema edit landed after these episodes were recorded
            raise SchemaError(
                f"dataset {self.store.location.url}: its fields were edited (version {self.store.version}) after "
                f"these {len(batch)} episode(s) were recorded under the old fields; they cannot be committed: "
                "flush(discard=True) drops them, new episodes use the new fields"
            )
        # A copy: lossy fields replace their rows by the decoded frames, and a pending batch must keep
        # the originals for the next try when this commit fails.
        batch = dataclasses.replace(batch, data=dict(batch.data))
        writes = []
        refs: dict[str, np.ndarray] = {}
        for f in self.schema.tensor_fields:
            where[0] = self.store.location.child_url(*array_parts(self.name, f))
            block = batch.data[f.key]
            arr = self._array(f)
            if isinstance(arr, FrameArray):  # checksums and statistics describe what reads return: decoded frames
                block = batch.data[f.key] = arr.round_trip(block)
            base = arr.reserve(len(block))
            where[0] = arr.where
            writes.append((arr.where, arr.write(base, block)))
            refs[f.key] = base + batch.row_starts(f)[:-1]
        summary = summarize(self.schema, batch, run_pooled if batch.nbytes >= TASK_BYTES else run_inline)
        failed: tuple[str, Exception] | None = None
        for array, w in writes:  # every write is awaited, so none is left in flight when one failed
            try:
                w.result()
            except Exception as exc:
                failed = failed or (array, exc)
        if failed is not None:
            where[0] = failed[0]
            raise failed[1]
        ids = (self.number << 32) | np.arange(self.seq, self.seq + len(batch), dtype=np.int64)
        quality = batch.failed is not None or QUARANTINED in {f.name for f in self.store.table.dt.schema().fields}
        rows = build_rows(self.schema, batch, summary, self.name, ids, refs, quality)
        where[0] = self.store.location.delta_uri()
        token = rows_token(rows)  # found in the log; the same rows (ids) always get the same one
        since = self.store.table.version  # the commit lands after it, if at all
        try:
            version = self.store.append(rows, token)  # evicts in the same commit when the dataset has a capacity
        except BaseException:
            # Its reply may be lost although it landed: settle() finds out before the next commit.
            self.in_doubt = InDoubt(token, since, len(batch), len(batch) - extra)
            raise
        self.seq += len(batch)
        self._forget_pending()
        self.store.committed()
        return version


_NAMED_AT_EXIT = 20  # pending episodes described one by one in the exit line


@dataclasses.dataclass(frozen=True)
class InDoubt:
    """A commit whose outcome is unknown (a storage fault after its log write may have been sent).

    ``token``: its token in the log; ``since``: the table version it read
    (it lands after it, if at all); ``episodes``: how many episodes it held
    (numbered from the sink's ``seq``); ``queued``: how many of them were the
    first pending ones (the rest came from a bulk call, which raised).
    """

    token: str
    since: int
    episodes: int
    queued: int


def _check_writable(store: Store) -> None:
    """Refuse a writer on a local dataset root that is read-only or not writable (:class:`StorageError`).

    Checked when the writer starts, so a collection loop fails before recording, not at its first commit.
    Object stores tell only when a write is refused (then the commit raises the fault).
    """
    loc = store.location
    if not loc.is_local or loc.ephemeral:
        return
    root = loc.path
    if os.statvfs(root).f_flag & os.ST_RDONLY:
        code, why = errno.EROFS, "the file system is read-only"
    elif not os.access(root, os.W_OK):
        code, why = errno.EACCES, "permission denied"
    else:
        return
    raise StorageError(
        f"cannot write to dataset {loc.url}: {why}; open it with read_only=True to read it",
        errno=code,
        dataset=loc.url,
        object=root,
    )
