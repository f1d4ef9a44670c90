"""Audit and clean-up of a dataset: :func:`validate` and :func:`vacuum`.

``validate`` re-derives everything that can be re-derived and compares it with
what is stored: every table file of the pinned version (present, size, row
count, partition values, the log's min/max of integer columns), every episode
(length, flags, unique id, per-step list lengths and shapes, tensor references
inside their arrays, CRC-32 of the tensor rows, statistics and return
recomputed from the values) and every Delta log entry (parseable JSON). It
reads every byte the version references, so it costs a full pass.

``vacuum`` removes what crashes and compactions leave behind without touching
anything a kept version references, whatever runs concurrently
(docs/reliability.md, "Vacuum and compaction"):

* table files (and derived side-table files) the log removed longer than the
  retention ago (compactions, deletes, evictions), and files the log never
  named (a writer killed between writing its Parquet file and its commit)
  once also older than :data:`~episodelake.table.UNREFERENCED_FLOOR_HOURS`
  (:func:`~episodelake.table.vacuum_table_files`);
* tensor arrays of writers no remaining table file references (a writer killed
  before its first commit), once untouched for the retention and the floor;
* commit arrays (``tensors/<writer>/<commit>/...``: object stores and
  capacity datasets) no episode of a stored table file references (a writer
  killed between its tensor write and its commit, a commit that failed, or
  every episode of the commit deleted or evicted and the files of the
  versions that held them vacuumed), once untouched for the retention, and
  past the floor too unless a later commit of the same writer is referenced
  (a writer commits in order, so that array's commit is over: not in flight);
* a writer's single array (local datasets) is never cut: its writer may be
  alive and grow it at any moment (TensorStore's resize does not check that
  the array is still the size vacuum saw, so cutting it could delete rows a
  commit is writing). Its unreferenced rows, at its end or between
  referenced ones (deleted episodes, a writer killed between its tensor
  write and its commit), are counted in ``VacuumReport.unreclaimed_rows``
  (``truncated`` stays empty; datasets created with a capacity use one
  array per commit, which goes whole);
* temporary files at the root, once past the retention and the floor.

``VacuumReport.unreferenced_rows`` counts every stored row no episode of a
stored table file references: what crashes and failed commits left behind,
plus rows of deleted or evicted episodes that share an array with an episode
still referenced; 0 on a healthy dataset nothing was deleted from.
(Object-store arrays written by 0.1.0 started each commit on a fresh shard;
the rows skipped to get there were never written and are not counted.)

Deleted and evicted episodes (``Dataset.delete``/``clear``, capacity) leave
the latest version in one commit; the table files of older versions still
hold them, so those versions (time travel, readers pinned to them) read them
until this vacuum removes those files (removed longer than the retention
window ago), and only then the tensor arrays they alone referenced.

What the floor protects is fixed: data a concurrent writer has not committed
yet (seconds old) is never removed. What the retention protects is the
caller's choice: versions superseded less than ``retention_hours`` ago stay
whole. Below :data:`~episodelake.table.MIN_RETENTION_HOURS` (1 h) a real run
needs ``break_old_versions=True``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.episode import rows_for
from ..core.errors import ArgumentError, CorruptionError, ReadOnlyError
from ..core.schema import DatasetSchema, FieldSpec, from_storage
from ..core.stats import STAT_PARTS, episode_stats, has_stats, stat_column
from ..read.snapshot import flatten_lists
from ..storage import layout, table_cache
from ..storage.arrays import (
    COMMIT_SHIFT,
    ROW_MASK,
    array_exists,
    array_parts,
    split_ref,
    tensor_writers,
    writer_commits,
)
from ..storage.location import Location
from ..storage.planned import read_many
from ..storage.store import Store
from ..storage.table import (
    COMPACT_EVERY,
    MIN_RETENTION_HOURS,
    UNREFERENCED_FLOOR_HOURS,
    EpisodeTable,
    arrow_schema,
    file_mtime,
    latest_file_paths,
    log_entries,
    log_problems,
    read_table_file,
    trim_log,
    vacuum_table_window,
)
from ..storage.tensors import TensorArray
from ..write.derived import vacuum_side

DEFAULT_RETENTION_HOURS = 168.0  # Delta's default deletedFileRetentionDuration (7 days)


@dataclass
class Problem:
    """One finding of :func:`validate`: what is wrong, in which file, for which episode."""

    kind: str
    message: str
    file: str | None = None
    episode_id: int | None = None

    def __str__(self) -> str:
        where = [f"episode {self.episode_id}"] if self.episode_id is not None else []
        where += [self.file] if self.file else []
        return f"[{self.kind}] {', '.join(where)}: {self.message}" if where else f"[{self.kind}] {self.message}"


@dataclass
class ValidationReport:
    """Outcome of :func:`validate`; ``ok`` is True when no problem was found."""

    url: str
    version: int
    episodes: int = 0
    steps: int = 0
    table_files: int = 0
    log_entries: int = 0
    tensor_rows: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> None:
        """Raise :class:`CorruptionError` listing the first problems, if there are any."""
        if self.problems:
            head = "\n  ".join(str(p) for p in self.problems[:10])
            more = f"\n  ... and {len(self.problems) - 10} more" if len(self.problems) > 10 else ""
            raise CorruptionError(f"{self.url} version {self.version}: {len(self.problems)} problem(s)\n  {head}{more}")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass
class VacuumReport:
    """What :func:`vacuum` removed (or, with ``dry_run``, would remove)."""

    url: str
    dry_run: bool
    retention_hours: float
    table_files: list[str] = field(default_factory=list)
    derived_files: list[str] = field(default_factory=list)  # of the derived-column side table (derived.py)
    tensor_arrays: list[str] = field(default_factory=list)
    truncated: list[dict[str, Any]] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    unreferenced_rows: int = 0
    unreclaimed_rows: int = 0
    keep_versions: int | None = None  # the version window of a capacity dataset's automatic vacuum (else None)
    log_files: list[str] = field(default_factory=list)  # log entries and checkpoints before that window

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- validate


def validate(store: Store, tensors: bool = True) -> ValidationReport:
    """Audit ``store`` at its pinned version; never raises for data problems, reports them.

    ``tensors=False`` skips reading tensor rows (references are still checked
    against array shapes). Writes nothing.
    """
    loc = store.location
    report = ValidationReport(loc.url, store.version)
    report.log_entries = len(log_entries(loc))
    report.problems += [Problem("log", what, file=path) for path, what in log_problems(loc)]
    seen: dict[int, str] = {}
    arrays: dict[tuple[str, int, str], TensorArray | None] = {}
    for add in store.table.add_actions():
        report.table_files += 1
        path = store.table.file_path(add["path"])
        tbl = _read_table_file(store, path, add, report)
        if tbl is None:
            continue
        for row in range(tbl.num_rows):
            _check_episode(store, tbl, row, path, seen, arrays, report, tensors)
    return report


def _read_table_file(store: Store, path: str, add: dict[str, Any], report: ValidationReport) -> pa.Table | None:
    """Read one data file of the version and check it against its log entry."""
    loc, rel = store.location, add["path"]
    if not loc.fs.exists(path):
        report.problems.append(Problem("table-file", "referenced by the log but missing", file=path))
        return None
    size = loc.fs.size(path)
    if size != add["size_bytes"]:
        report.problems.append(Problem("table-file", f"{size} bytes, the log says {add['size_bytes']}", file=path))
    try:
        tbl = read_table_file(loc, path)
    except (OSError, pa.ArrowException) as exc:
        report.problems.append(Problem("table-file", f"unreadable Parquet: {exc}", file=path))
        return None
    partitions = {k[10:] for k in add if k.startswith("partition.")}
    wanted = [f for f in arrow_schema(store.schema) if f.name not in partitions]
    off = [
        f.name
        for f in wanted
        if f.name not in tbl.column_names or not _same_type(tbl.schema.field(f.name).type, f.type)
    ]
    if off:
        report.problems.append(Problem("table-file", f"columns missing or of the wrong type: {off}", file=path))
        return None
    if tbl.num_rows != add["num_records"]:
        report.problems.append(
            Problem("table-file", f"{tbl.num_rows} rows, the log says {add['num_records']}", file=path)
        )
    for key, value in add.items():
        if key.startswith("partition.") and value is not None and f"{key[10:]}={value}" not in rel.split("/"):
            report.problems.append(Problem("table-file", f"log partition value {key[10:]}={value!r}", file=path))
        if key.startswith(("min.", "max.")) and value is not None and isinstance(value, int):
            column = key[4:]
            if column in tbl.column_names and tbl.num_rows:
                actual = pc.min(tbl[column]) if key.startswith("min.") else pc.max(tbl[column])
                if actual.as_py() != value:
                    report.problems.append(
                        Problem("table-file", f"log {key} is {value}, the file holds {actual.as_py()}", file=path)
                    )
    return tbl


def _same_type(stored: pa.DataType, want: pa.DataType) -> bool:
    """Whether a stored column type reads as ``want``: deltalake's own rewrites (``DeltaTable.delete``, merge)
    store strings as ``string_view``/``large_string`` and lists as large or view lists, which read the same."""
    if pa.types.is_string(want):
        return pa.types.is_string(stored) or pa.types.is_large_string(stored) or pa.types.is_string_view(stored)
    if pa.types.is_list(want):
        lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view, pa.types.is_large_list_view)
        return any(is_list(stored) for is_list in lists) and _same_type(stored.value_type, want.value_type)
    return stored == want


def _check_episode(
    store: Store,
    tbl: pa.Table,
    row: int,
    path: str,
    seen: dict[int, str],
    arrays: dict[tuple[str, int, str], TensorArray | None],
    report: ValidationReport,
    tensors: bool,
) -> None:
    schema = store.schema
    rec = {name: tbl[name][row] for name in tbl.column_names}
    eid = rec["episode_id"].as_py()
    length = rec["length"].as_py()

    def problem(kind: str, message: str, file: str = path) -> None:
        report.problems.append(Problem(kind, message, file=file, episode_id=eid))

    if eid in seen:
        problem("ids", f"episode id also in {seen[eid]}")
    seen[eid] = path
    report.episodes += 1
    if not isinstance(length, int) or length < 1:
        problem("length", f"length {length!r} (must be >= 1)")
        return
    report.steps += length
    if rec["terminated"].as_py() and rec["truncated"].as_py():
        problem("flags", "terminated and truncated are both set")
    values: dict[str, np.ndarray] = {}
    for f in schema.step_fields:
        rows = rows_for(f, length)
        if f.in_tensor:
            got = _tensor_rows(store, f, rec, rows, arrays, problem, tensors)
            if got is not None:
                report.tensor_rows += rows
                if zlib.crc32(np.ascontiguousarray(got).data) != rec[f"crc/{f.key}"].as_py():
                    arr = arrays[(rec["writer"].as_py(), split_ref(rec[f"ref/{f.key}"].as_py())[0], f.key)]
                    where = arr.where if arr else path
                    problem("checksum", f"field {f.key!r}: CRC-32 of its tensor rows differs", where)
        else:
            got = _table_rows(f, rec[f.key], rows, problem)
        if got is not None:
            values[f.key] = got
            if has_stats(f):
                _check_stats(f, got, rec, problem)
    _check_return(store.schema, values, rec, problem)


def _table_rows(f: FieldSpec, scalar: pa.Scalar, rows: int, problem) -> np.ndarray | None:
    """Decode one episode's list value of a table field, checking every nesting level."""
    arr = pa.array([scalar.as_py()], scalar.type)
    dims = (rows, *f.shape) + ((2,) if f.np_dtype.kind == "c" else ())
    for depth, want in enumerate(dims):
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if lengths.size == 0 or (lengths != want).any():
            found = sorted(set(lengths.tolist()))
            problem("length", f"field {f.key!r}: level {depth} has lengths {found}, want {want}")
            return None
        arr = pc.list_flatten(arr)
    return from_storage(flatten_lists(arr, 0).reshape(dims), f.np_dtype)


def _tensor_rows(store: Store, f: FieldSpec, rec, rows: int, arrays, problem, read: bool) -> np.ndarray | None:
    writer = rec["writer"].as_py()
    commit, start = split_ref(rec[f"ref/{f.key}"].as_py())
    key = (writer, commit, f.key)
    if key not in arrays:
        try:
            arrays[key] = store.open_array(writer, f, commit)
        except CorruptionError as exc:
            arrays[key] = None
            problem("tensor", str(exc), store.location.child_url(*array_parts(writer, f, commit)))
    arr = arrays[key]
    if arr is None:
        return None
    if start < 0 or start + rows > arr.rows:
        problem("tensor", f"field {f.key!r} references rows [{start}, {start + rows}), array has {arr.rows}", arr.where)
        return None
    if not read:
        return None
    try:
        return read_many([(arr, start, start + rows)])[0]
    except ValueError as exc:  # TensorStore: a chunk file is missing, truncated or undecodable
        problem("tensor", f"field {f.key!r} rows [{start}, {start + rows}) unreadable: {exc}", arr.where)
        return None


def _check_stats(f: FieldSpec, values: np.ndarray, rec, problem) -> None:
    want = episode_stats(f, values)
    if rec[stat_column(f, "count")].as_py() != want["count"]:
        problem("stats", f"field {f.key!r}: stored count differs from the values")
        return
    for part in STAT_PARTS[1:]:
        stored = rec[stat_column(f, part)].as_py()
        exact = part in ("min", "max")
        if stored is None or len(stored) != len(want[part]):
            problem("stats", f"field {f.key!r}: stored {part} is {stored!r}")
        elif not (np.array_equal(stored, want[part]) if exact else np.allclose(stored, want[part], rtol=1e-6)):
            problem("stats", f"field {f.key!r}: stored {part} differs from the values")


def _check_return(schema: DatasetSchema, values: dict[str, np.ndarray], rec, problem) -> None:
    rewards = schema.role_fields("reward")
    stored = rec["return"].as_py()
    if len(rewards) == 1 and rewards[0].key in values and stored is not None:
        actual = float(values[rewards[0].key].sum(dtype=np.float64))
        if not np.isclose(actual, stored, rtol=1e-9, atol=1e-9):
            problem("stats", f"stored return {stored} differs from the rewards' sum {actual}")


# ---------------------------------------------------------------- vacuum


class AutoVacuum:
    """Vacuums a capacity dataset on local disk on the buffer's own cadence, counted in commits through ``store``.

    With ``capacity.retention_hours`` None (the version window, the default):
    after every eighth of the buffer rewritten, measured in the commits its
    live episodes span (at the last vacuum; at least 1 commit, at most
    ``capacity.vacuum_every``), keeping the last ``capacity.keep_versions``
    versions whole and trimming the log before them; every ``COMPACT_EVERY``
    commits it compacts the table first, in this thread (a compaction on a
    thread of its own would race the writer's evictions, lose, and leave its
    files for the floor), which also writes the checkpoint the log is trimmed
    to. With a number of hours:
    every ``capacity.vacuum_every`` commits, with that retention (and its
    ``break_old_versions``). Runs in the committing thread right after the
    commit; a failure is reported as a warning (the commit stands).
    """

    def __init__(self, store: Store) -> None:
        assert store.capacity is not None
        self.store = store
        self.capacity = store.capacity
        self.commits = 0
        self.uncompacted = 0
        # by commits: the first vacuum comes at once, then the cadence follows what the buffer spans
        self.interval = 1 if self.capacity.retention_hours is None else self.capacity.vacuum_every
        if self.capacity.retention_hours is None:
            # compacted here, between this writer's commits: a compaction on a thread of its own would race
            # them, lose (an eviction removed a file it rewrote) and leave its files for the floor
            store.table.auto_compact = False
        store.on_commit(self._on_commit)  # held weakly: the Dataset keeps this object

    def _on_commit(self) -> None:
        capacity = self.capacity
        self.commits += 1
        self.uncompacted += 1
        if capacity.retention_hours is None and self.uncompacted >= COMPACT_EVERY:
            self.uncompacted = 0
            try:
                self.store.table.compact()  # small files merged, and a checkpoint the log is trimmed to
            except Exception as exc:  # another writer's commits won every round: the vacuum still runs
                warnings.warn(f"automatic compaction of {self.store.location.url} failed: {exc!r}", stacklevel=2)
        if self.commits < self.interval:
            return
        self.commits = 0
        try:
            if capacity.retention_hours is None:
                _, spanned = _vacuum(self.store, keep_versions=capacity.keep_versions)
                self.interval = min(capacity.vacuum_every, max(1, spanned // 8))
            else:
                vacuum(
                    self.store,
                    retention_hours=capacity.retention_hours,
                    break_old_versions=capacity.break_old_versions,
                )
        except Exception as exc:  # the commit already landed; the next round retries
            warnings.warn(f"automatic vacuum of {self.store.location.url} failed: {exc!r}", stacklevel=2)


def check_retention(retention_hours: float, break_old_versions: bool, what: str = "vacuum") -> None:
    """Refuse a retention below :data:`MIN_RETENTION_HOURS` unless ``break_old_versions`` (ArgumentError)."""
    if isinstance(retention_hours, bool) or not isinstance(retention_hours, int | float) or not retention_hours >= 0:
        raise ArgumentError(f"retention_hours must be >= 0, got {retention_hours!r}")
    if retention_hours < MIN_RETENTION_HOURS and not break_old_versions:
        raise ArgumentError(
            f"{what}: retention_hours={retention_hours} is below the safe minimum of {MIN_RETENTION_HOURS:g} h: "
            f"files of versions superseded less than {MIN_RETENTION_HOURS:g} h ago would be removed, so time travel "
            "to them and readers still pinned to them (another process's snapshot, a running stream) would fail; "
            "pass break_old_versions=True (episodelake vacuum --break-old-versions) to accept that "
            "(uncommitted data of concurrent writers stays safe either "
            f"way: files no version references are kept for at least {UNREFERENCED_FLOOR_HOURS:g} h)"
        )


def vacuum(
    store: Store,
    dry_run: bool = False,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    break_old_versions: bool = False,
    keep_versions: int | None = None,
) -> VacuumReport:
    """Remove table files, side-table files and tensor data no kept version references (see the module docstring).

    Versions superseded less than ``retention_hours`` ago stay whole; data no
    version references (a commit in flight, a crash leftover) goes only once
    older than :data:`UNREFERENCED_FLOOR_HOURS` too, whatever the retention.
    A real run with ``retention_hours`` below :data:`MIN_RETENTION_HOURS`
    raises :class:`ArgumentError` unless ``break_old_versions=True`` (a dry
    run removes nothing and needs no override). Raises
    :class:`ReadOnlyError` on a read-only dataset unless ``dry_run``, and
    :class:`CorruptionError` (removing nothing from the tensors) when a
    table file cannot be read, since its references would be unknown.

    ``keep_versions`` (a capacity dataset's version window; ``retention_hours``
    is then not used): the last ``keep_versions`` versions of the episode
    table stay whole, whatever their age, and everything only older versions
    reference goes: their table files (:func:`~episodelake.table.vacuum_table_window`),
    the tensor arrays no kept file references (once their commit is known to
    be over; possibly in flight: the floor), and the log entries before the
    newest checkpoint at or before the window (``trim_log``: time travel to
    those versions raises :class:`ArgumentError`). The derived side table
    keeps :data:`MIN_RETENTION_HOURS`.
    """
    return _vacuum(store, dry_run, retention_hours, break_old_versions, keep_versions)[0]


def _vacuum(
    store: Store,
    dry_run: bool = False,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    break_old_versions: bool = False,
    keep_versions: int | None = None,
) -> tuple[VacuumReport, int]:
    """:func:`vacuum`, and how many ``(writer, commit)`` tensor arrays the kept table files reference."""
    loc = store.location
    if store.read_only and not dry_run:
        raise ReadOnlyError(f"dataset {loc.url} is open read-only; vacuum needs a writable dataset")
    now = time.time()
    if keep_versions is None:
        check_retention(retention_hours, break_old_versions or dry_run)
        report = VacuumReport(loc.url, dry_run, float(retention_hours))
        cutoffs = _Cutoffs(
            now - retention_hours * 3600.0, now - max(retention_hours, UNREFERENCED_FLOOR_HOURS) * 3600.0
        )
        # What goes is planned first, so the references of the files about to go are read while they exist:
        # their arrays' commits landed once (not in flight). A file the real run removes beyond the plan had
        # its references counted as live (kept one more round).
        planned = store.table.vacuum(retention_hours, dry_run=True)
        refs, settled = _referenced_rows(store, set(planned))
        report.table_files = planned if dry_run else store.table.vacuum(retention_hours, dry_run=False)
        report.derived_files = vacuum_side(loc, retention_hours, dry_run)
    else:
        if isinstance(keep_versions, bool) or not isinstance(keep_versions, int) or keep_versions < 1:
            raise ArgumentError(f"keep_versions must be a positive int, got {keep_versions!r}")
        report = VacuumReport(loc.url, dry_run, 0.0, keep_versions=keep_versions)
        cutoffs = _Cutoffs(now, now - UNREFERENCED_FLOOR_HOURS * 3600.0)  # settled commits: no time window
        latest = EpisodeTable.open(loc).version  # before the files go: the log is trimmed only up to its window
        planned = vacuum_table_window(loc, layout.table_parts(), keep_versions, dry_run=True)
        refs, settled = _referenced_rows(store, set(planned))
        if dry_run:
            report.table_files = planned
        else:
            report.table_files = vacuum_table_window(loc, layout.table_parts(), keep_versions, dry_run=False)
            table_cache.prune(loc, UNREFERENCED_FLOOR_HOURS * 3600.0)  # the entries of the files gone with them
            store.table.refresh()
        report.derived_files = vacuum_side(loc, MIN_RETENTION_HOURS, dry_run)
    _vacuum_tensors(store, refs, settled, cutoffs, report)
    for path in loc.fs.glob(loc.child(layout.temp_pattern())):
        if _newest_mtime(loc, path) < cutoffs.unreferenced:
            report.temp_files.append(path)
            if not dry_run:
                _remove(loc, path)
    if keep_versions is not None:
        # after the files: an entry goes only once the files it removed went (their versions are outside the window)
        report.log_files = trim_log(loc, layout.table_parts(), latest - keep_versions + 1, dry_run)
    return report, len({(w, c) for w, c, _ in refs})


@dataclass(frozen=True)
class _Cutoffs:
    """Modification times (epoch s) before which unreferenced tensor data may go.

    ``settled``: data whose commit is known to be over (a later commit of its
    writer is referenced): the retention alone. ``unreferenced``: anything
    else no table file references (possibly in flight): the retention and the floor.
    """

    settled: float
    unreferenced: float


Runs = dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray]]


def _referenced_rows(store: Store, doomed: set[str]) -> tuple[Runs, set[tuple[str, int]]]:
    """The references of every episode in a surviving table file, and the ``(writer, commit)`` arrays ever committed.

    Runs: (writer, commit, field key) -> (first rows, stops). Surviving: every
    data file on storage but ``doomed`` (those this vacuum removes), and then
    every file of the latest version read now (a commit that landed while the
    listing ran: its files are never removed, nor what they reference). The
    set holds the arrays some stored file references, ``doomed`` included:
    their commit landed, so they are not in flight.
    """
    loc = store.location
    fields = store.schema.tensor_fields
    columns = ["writer", "length", *(f"ref/{f.key}" for f in fields)]
    parts: dict[tuple[str, int, str], list[tuple[np.ndarray, np.ndarray]]] = {}
    committed: set[tuple[str, int]] = set()
    listed = list(store.table.stored_files())
    seen = {path.rsplit("/", 1)[-1] for path in listed}
    latest = [path for path in latest_file_paths(loc) if path.rsplit("/", 1)[-1] not in seen]
    for path in [*listed, *latest]:
        try:
            tbl = read_table_file(loc, path, columns)
        except FileNotFoundError:
            # only a vacuum removes table files, and never one of the latest version
            if path in doomed or path.rsplit("/", 1)[-1] not in {p.rsplit("/", 1)[-1] for p in latest_file_paths(loc)}:
                continue  # a concurrent vacuum removed it: the versions that held it are gone already
            raise CorruptionError(f"{path}: a file of the latest version is missing, tensors left untouched") from None
        except (OSError, pa.ArrowException) as exc:
            raise CorruptionError(f"{path}: unreadable table file, tensors left untouched: {exc}") from exc
        writers = tbl["writer"].to_numpy(zero_copy_only=False)
        lengths = tbl["length"].to_numpy()
        for f in fields:
            refs = tbl[f"ref/{f.key}"].to_numpy()
            starts = refs & ROW_MASK
            stops = starts + rows_for(f, lengths)
            commits = refs >> COMMIT_SHIFT
            for w in np.unique(writers):
                for c in np.unique(commits[writers == w]).tolist():
                    committed.add((str(w), c))
                    if path in doomed:
                        continue
                    mine = (writers == w) & (commits == c)
                    parts.setdefault((str(w), c, f.key), []).append((starts[mine], stops[mine]))
    runs = {k: (np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v])) for k, v in parts.items()}
    return runs, committed


def _unreferenced(starts: np.ndarray, stops: np.ndarray, rows: int, align: int) -> tuple[int, int]:
    """(unreferenced rows inside the referenced span, unreferenced rows after it) of an array of ``rows`` rows.

    Each commit started at a multiple of ``align`` (0.1.0 object-store arrays:
    a shard); rows skipped to reach it were never written and do not count.
    """
    order = np.argsort(starts, kind="stable")
    inside, end = 0, 0
    for a, b in zip(starts[order].tolist(), stops[order].tolist(), strict=True):
        if a > end:
            inside += max(0, a - -(-end // align) * align)
        end = max(end, b)
    return inside, max(0, rows - -(-end // align) * align)


def _vacuum_tensors(
    store: Store, refs: Runs, committed: set[tuple[str, int]], cutoffs: _Cutoffs, report: VacuumReport
) -> None:
    loc = store.location
    if not store.schema.tensor_fields:  # all dropped (ds.columns.drop): older versions may still read the arrays
        return
    live = {w for w, _, _ in refs}
    last_commit: dict[str, int] = {}  # per writer, its latest commit a table file references
    for w, c in committed:
        last_commit[w] = max(c, last_commit.get(w, 0))
    for writer in tensor_writers(loc):
        wdir = loc.child(*layout.writer_parts(writer))
        try:
            commits = writer_commits(loc, writer)
        except FileNotFoundError:
            continue  # a concurrent vacuum removed it meanwhile
        if writer not in live:  # it may be alive, about to write (a first commit, a single array): the floor applies
            report.unreferenced_rows += _stored_rows(store, writer, commits)
            if _newest_mtime(loc, wdir) < cutoffs.unreferenced:
                report.tensor_arrays.append(wdir)
                if not report.dry_run:
                    _remove(loc, wdir)
            continue
        for f in store.schema.tensor_fields:
            _count_single_array(store, writer, f, refs, report)
            for commit in commits:
                # not in flight: its commit landed, or a later commit of its writer did (a writer commits in order)
                done = (writer, commit) in committed or commit < last_commit.get(writer, 0)
                cutoff = cutoffs.settled if done else cutoffs.unreferenced
                _vacuum_commit_array(store, writer, commit, f, refs, cutoff, report)
        if not report.dry_run:
            for commit in commits:  # a commit directory whose arrays all went
                cdir = loc.child(*layout.writer_parts(writer, commit))
                empty = loc.is_local and loc.fs.exists(cdir) and not loc.fs.find(cdir)
                if empty and _newest_mtime(loc, cdir) < cutoffs.unreferenced:  # (or one being created now)
                    _remove(loc, cdir)


def _stored_rows(store: Store, writer: str, commits: list[int]) -> int:
    """Rows of every array of ``writer`` (an array that cannot be opened counts 0: nothing readable is in it)."""
    total = 0
    for f in store.schema.tensor_fields:
        for commit in [0, *commits]:
            if array_exists(store.location, writer, f, commit):
                try:
                    total += store.open_array(writer, f, commit).rows
                except CorruptionError:
                    continue
    return total


def _count_single_array(store: Store, writer: str, f: FieldSpec, refs: Runs, report: VacuumReport) -> None:
    """A writer's single array: count its unreferenced rows (never cut: its writer may be growing it)."""
    loc = store.location
    if not array_exists(loc, writer, f):
        return
    starts, stops = refs.get((writer, 0, f.key), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    arr = store.open_array(writer, f)
    align = 1 if loc.is_local else arr.write_rows
    inside, after = _unreferenced(starts, stops, arr.rows, align)
    report.unreferenced_rows += inside + after
    report.unreclaimed_rows += inside + after


def _vacuum_commit_array(
    store: Store, writer: str, commit: int, f: FieldSpec, refs: Runs, cutoff: float, report: VacuumReport
) -> None:
    """One commit's array (object stores): removed whole when no episode references it."""
    loc = store.location
    if not array_exists(loc, writer, f, commit):
        return
    try:
        arr = store.open_array(writer, f, commit)
    except CorruptionError:
        if not array_exists(loc, writer, f, commit):
            return  # a concurrent vacuum removed it meanwhile
        raise
    if (writer, commit, f.key) in refs:
        inside, after = _unreferenced(*refs[(writer, commit, f.key)], arr.rows, 1)
        report.unreferenced_rows += inside + after
        report.unreclaimed_rows += inside + after
        return
    report.unreferenced_rows += arr.rows
    path = loc.child(*array_parts(writer, f, commit))
    if _newest_mtime(loc, path) < cutoff:
        report.tensor_arrays.append(path)
        if not report.dry_run:
            _remove(loc, path)


def _remove(loc: Location, path: str) -> None:
    """Delete a file or directory tree; one a concurrent vacuum removed first is no error."""
    with contextlib.suppress(FileNotFoundError):
        loc.fs.rm(path, recursive=True)


def _newest_mtime(loc: Location, path: str) -> float:
    """Latest modification time (epoch seconds) of a file or of anything under a directory.

    Local directories count too (an array being created may have no file
    yet); object stores have no directories. Nothing found (removed
    meanwhile) counts as written now: never old enough to delete.
    """
    try:
        if loc.fs.isdir(path):
            entries = loc.fs.find(path, detail=True, withdirs=loc.is_local)
            if loc.is_local:
                entries[path] = loc.fs.info(path)
        else:
            entries = {path: loc.fs.info(path)}
    except FileNotFoundError:
        return time.time()
    return max((file_mtime(info) for info in entries.values()), default=time.time())
