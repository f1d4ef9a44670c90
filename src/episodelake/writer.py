"""The write path: validation, per-episode writers, a vector-env writer, commit batching.

Contracts:

* Every value is validated before anything changes. A rejected ``add_step``
  or episode raises :class:`ValidationError` naming the field and the step and
  leaves the writer (and the dataset) exactly as before the call.
* Finished episodes wait in memory until a commit: when ``commit_episodes``
  episodes or ``commit_bytes`` payload bytes are pending, when
  ``commit_seconds`` passed since the first pending episode finished (checked
  when an episode finishes), or on ``flush()``/``close()``. Tensor rows are
  written before the table commit that references them, so a crash loses only
  uncommitted episodes. Memory held: the pending episodes (at most about
  ``commit_bytes`` plus one episode) plus each open episode's step buffers.
"""

from __future__ import annotations

import atexit
import math
import os
import secrets
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .errors import EpisodeStateError, ReadOnlyError, ValidationError
from .schema import STRING_LIMIT, DatasetSchema, FieldSpec, flatten_role, to_storage
from .table import STAT_PARTS, arrow_schema, has_stats, stat_column
from .tensors import TensorArray

if TYPE_CHECKING:
    from .dataset import Dataset

# Dict-form episode keys -> roles (the episodata convention, plurals).
EPISODE_KEYS = {"observations": "observation", "actions": "action", "rewards": "reward", "extras": "extra"}
STEP_KEYS = {
    **EPISODE_KEYS,
    "observation": "observation",
    "obs": "observation",
    "action": "action",
    "reward": "reward",
    "extra": "extra",
    "infos": "extra",
}
_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


# ---------------------------------------------------------------- validation


def check_values(f: FieldSpec, value: Any, lead: tuple[int, ...], where: str) -> np.ndarray:
    """Return ``value`` as ``f``'s dtype with shape ``lead + f.shape``, or raise.

    Accepted: same or wider kind (bool -> int -> float -> complex), integers
    within the target's range, finite values when ``f.finite``.
    """
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise ValidationError(f"{where}: field {f.key!r} is not array-like: {exc}") from exc
    want = lead + f.shape
    if arr.shape != want:
        raise ValidationError(f"{where}: field {f.key!r} has shape {arr.shape}, expected {want}")
    dt = f.np_dtype
    if arr.dtype == dt:
        out = arr
    else:
        kind = arr.dtype.kind
        if kind not in _KIND_RANK or _KIND_RANK[kind] > _KIND_RANK[dt.kind]:
            raise ValidationError(f"{where}: field {f.key!r} has dtype {arr.dtype}, expected {dt}")
        if dt.kind in "iu" and kind in "iu" and arr.size:
            info = np.iinfo(dt)
            lo, hi = arr.min(), arr.max()
            if lo < info.min or hi > info.max:
                raise ValidationError(f"{where}: field {f.key!r} values [{lo}, {hi}] do not fit {dt}")
        out = arr.astype(dt)
    if f.finite and dt.kind in "fc" and not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out.reshape(len(out), -1) if lead else out.reshape(1, -1)))[0][0]
        step = f" (first at row {bad})" if lead else ""
        raise ValidationError(f"{where}: field {f.key!r} has NaN or infinity{step}")
    return out


def split_role(schema: DatasetSchema, role: str, value: Any, where: str) -> dict[str, Any]:
    """Map a role's value (array, or nested dict of arrays) to field keys; exact key set."""
    fields = schema.role_fields(role)
    if schema.unwrapped(role) and not isinstance(value, Mapping):
        return {fields[0].key: value}
    if not isinstance(value, Mapping):
        raise ValidationError(f"{where}: {role} must be a dict with keys {[f.name for f in fields]}")
    flat = flatten_role(value)
    names = {f.name: f.key for f in fields}
    unknown = sorted(set(flat) - set(names))
    missing = sorted(set(names) - set(flat))
    if unknown:
        raise ValidationError(f"{where}: unknown {role} field(s) {unknown}; schema has {sorted(names)}")
    if missing:
        raise ValidationError(f"{where}: missing {role} field(s) {missing}")
    return {names[k]: v for k, v in flat.items()}


def check_meta(schema: DatasetSchema, meta: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate per-episode meta values; missing meta fields are stored as null."""
    fields = {f.name: f for f in schema.meta_fields}
    unknown = sorted(set(meta) - set(fields))
    if unknown:
        raise ValidationError(f"{where}: unknown meta field(s) {unknown}; schema has {sorted(fields)}")
    out: dict[str, Any] = {}
    for name, value in meta.items():
        f = fields[name]
        if value is None:
            out[name] = None
        elif f.np_dtype.kind == "U":
            if not isinstance(value, str):
                raise ValidationError(f"{where}: meta field {name!r} must be str, got {type(value).__name__}")
            if len(value.encode()) > STRING_LIMIT:
                raise ValidationError(f"{where}: meta field {name!r} is longer than {STRING_LIMIT} bytes")
            out[name] = value
        else:
            out[name] = check_values(f, value, (), where)
    return out


def check_flags(terminated: Any, truncated: Any, where: str) -> tuple[bool, bool]:
    flags = []
    for name, v in (("terminated", terminated), ("truncated", truncated)):
        arr = np.asarray(v)
        if arr.shape != () or arr.dtype.kind not in "bui":
            raise ValidationError(f"{where}: {name} must be a scalar bool, got {v!r}")
        if arr.dtype.kind != "b" and int(arr) not in (0, 1):
            raise ValidationError(f"{where}: {name} must be a bool, got {v!r}")
        flags.append(bool(arr))
    if flags[0] and flags[1]:
        raise ValidationError(f"{where}: terminated and truncated are both set")
    return flags[0], flags[1]


# ---------------------------------------------------------------- finished episodes


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


# ---------------------------------------------------------------- commit batching


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


# ---------------------------------------------------------------- episode writers


class _Buffers:
    """Growable per-field step buffers (doubling), so add_step is O(1) amortized."""

    def __init__(self, fields: Sequence[FieldSpec], capacity: int = 64) -> None:
        self.fields = fields
        self.arrays = {f.key: np.empty((capacity, *f.shape), f.np_dtype) for f in fields}
        self.size = {f.key: 0 for f in fields}

    def put(self, key: str, value: np.ndarray) -> None:
        arr = self.arrays[key]
        n = self.size[key]
        if n == len(arr):
            arr = np.concatenate([arr, np.empty_like(arr)])
            self.arrays[key] = arr
        arr[n] = value
        self.size[key] = n + 1

    def take(self) -> dict[str, np.ndarray]:
        return {k: a[: self.size[k]].copy() for k, a in self.arrays.items()}


class EpisodeWriter:
    """Records one episode step by step. Create with :meth:`Dataset.new_episode`.

    The writer finalizes itself on the step that sets ``terminated`` or
    ``truncated``; ``finish()`` ends an episode without either flag (e.g. a
    collection budget ran out) and ``discard()`` drops it. An episode is never
    visible until committed.
    """

    def __init__(self, sink: CommitSink, initial_obs: Any, meta: Mapping[str, Any]) -> None:
        self.sink = sink
        schema = sink.schema
        self.meta = check_meta(schema, meta, "new_episode")
        obs = split_role(schema, "observation", initial_obs, "initial observation")
        checked = {k: check_values(schema[k], v, (), "initial observation") for k, v in obs.items()}
        self._bufs = _Buffers(schema.step_fields)
        for k, v in checked.items():
            self._bufs.put(k, v)
        self._roles = [(r, schema.role_fields(r)) for r in ("observation", "action", "reward", "extra")]
        self.length = 0
        self.done = False

    def add_step(self, step: Mapping[str, Any]) -> EpisodeWriter:
        """Append one transition; validates everything before storing anything.

        ``step`` holds ``observations`` (the observation the action produced),
        ``actions``, ``rewards``, optional ``extras``, ``terminated`` and
        ``truncated`` (singular names and ``obs`` are accepted too).
        """
        self._apply(*self.check_step(step))
        return self

    def check_step(self, step: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], bool, bool]:
        """Validate ``step`` without storing it: (values by field key, terminated, truncated)."""
        if self.done:
            raise EpisodeStateError(f"step {self.length}: the episode already ended; start a new one")
        where = f"step {self.length}"
        schema = self.sink.schema
        by_role: dict[str, Any] = {}
        for key, value in step.items():
            if key in ("terminated", "truncated"):
                continue
            role = STEP_KEYS.get(key)
            if role is None:
                raise ValidationError(
                    f"{where}: unknown key {key!r}; expected {sorted(STEP_KEYS)} + terminated/truncated"
                )
            if role in by_role:
                raise ValidationError(f"{where}: {role} given twice")
            by_role[role] = value
        checked: dict[str, np.ndarray] = {}
        for role, fields in self._roles:
            if not fields:
                continue
            if role not in by_role:
                raise ValidationError(f"{where}: missing {role}")
            for k, v in split_role(schema, role, by_role[role], where).items():
                checked[k] = check_values(schema[k], v, (), where)
        terminated, truncated = check_flags(step.get("terminated", False), step.get("truncated", False), where)
        return checked, terminated, truncated

    def _apply(self, checked: Mapping[str, np.ndarray], terminated: bool, truncated: bool) -> None:
        for k, v in checked.items():
            self._bufs.put(k, v)
        self.length += 1
        if terminated or truncated:
            self._finish(terminated, truncated)

    def finish(self) -> None:
        """End the episode here without a terminal flag (neither terminated nor truncated)."""
        if self.done:
            raise EpisodeStateError("the episode already ended")
        self._finish(False, False)

    def discard(self) -> None:
        """Drop the episode; nothing of it is ever stored."""
        self.done = True
        self._bufs = _Buffers(())

    def _finish(self, terminated: bool, truncated: bool) -> None:
        if self.length == 0:
            raise ValidationError("an episode needs at least one step")
        self.done = True
        data = self._bufs.take()
        self._bufs = _Buffers(())
        self.sink.submit(FinishedEpisode(data, self.length, terminated, truncated, self.meta))

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if not self.done:
            if exc_type is None and self.length:
                self.finish()
            else:
                self.discard()


def episode_from_dict(schema: DatasetSchema, episode: Mapping[str, Any], where: str) -> FinishedEpisode:
    """Validate one episode in dict form (see :meth:`Dataset.from_episodes`)."""
    known = {"initial_observation", "terminated", "truncated", "meta", *EPISODE_KEYS}
    unknown = sorted(set(episode) - known)
    if unknown:
        raise ValidationError(f"{where}: unknown key(s) {unknown}; expected {sorted(known)}")
    if "actions" not in episode:
        raise ValidationError(f"{where}: missing actions")
    data: dict[str, np.ndarray] = {}
    acts = split_role(schema, "action", episode["actions"], where)
    first = next(iter(acts.values()))
    length = len(first) if hasattr(first, "__len__") else 0
    if length == 0:
        raise ValidationError(f"{where}: an episode needs at least one step")
    for role_key, role in EPISODE_KEYS.items():
        fields = schema.role_fields(role)
        if not fields:
            continue
        if role_key not in episode:
            raise ValidationError(f"{where}: missing {role_key}")
        values = split_role(schema, role, episode[role_key], where)
        if role == "observation" and "initial_observation" in episode:
            init = split_role(schema, role, episode["initial_observation"], f"{where} initial observation")
            for k, v in values.items():
                head = check_values(schema[k], init[k], (), f"{where} initial observation")
                rows = check_values(schema[k], v, (length,), f"{where} observations")
                data[k] = np.concatenate([head[None], rows])
        else:
            rows = length + 1 if role == "observation" else length
            for k, v in values.items():
                data[k] = check_values(schema[k], v, (rows,), f"{where} {role_key}")
    terminated, truncated = _episode_flags(episode, length, where)
    meta = check_meta(schema, episode.get("meta") or {}, where)
    return FinishedEpisode(data, length, terminated, truncated, meta)


def _episode_flags(episode: Mapping[str, Any], length: int, where: str) -> tuple[bool, bool]:
    """Episode-level flags from scalars or per-step arrays (set on the last step only)."""
    flags = []
    for name in ("terminated", "truncated"):
        value = np.asarray(episode.get(name, False))
        if value.ndim == 1:
            if value.shape != (length,) or value.dtype.kind not in "bui":
                raise ValidationError(f"{where}: {name} must be a bool or bool[{length}]")
            early = np.flatnonzero(value[:-1])
            if early.size:
                raise ValidationError(f"{where}: {name} is set at step {early[0]} before the last step")
            value = value[-1]
        flags.append(value)
    return check_flags(flags[0], flags[1], where)


def write_episodes(sink: CommitSink, episodes: Iterable[Mapping[str, Any]]) -> int:
    """Validate and submit dict-form episodes; returns how many were written.

    A rejected episode withdraws this call's episodes that are still pending
    (so a batch within one commit is all or nothing); episodes an automatic
    commit already stored during the call stay.
    """
    count = 0
    seq, kept = sink.seq, len(sink.pending)
    try:
        for i, ep in enumerate(episodes):
            sink.submit(episode_from_dict(sink.schema, ep, f"episode {i}"))
            count += 1
    except ValidationError:
        sink.pending = sink.pending[:kept] if sink.seq == seq else []
        sink.pending_bytes = sum(e.nbytes for e in sink.pending)
        raise
    return count


class VectorEpisodeWriter:
    """Records N parallel envs (Gymnasium 1.x vector API) as N sequential runs.

    ``autoreset_mode`` follows ``gymnasium.vector.AutoresetMode``:

    * ``"next_step"`` (Gymnasium's default): after env i ends, the next
      ``add_steps`` row for i is its reset (action ignored, reward 0); that row
      starts i's next episode and records no transition.
    * ``"same_step"``: the row that ends env i carries the *reset* observation;
      the true last observation comes from ``infos["final_obs"][i]``.

    ``meta`` is a mapping (same meta for every episode) or a callable
    ``meta(env_index) -> mapping`` called when each episode starts.
    """

    def __init__(
        self,
        sink: CommitSink,
        initial_obs: Any,
        num_envs: int,
        autoreset_mode: str = "next_step",
        meta: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
    ) -> None:
        # Accept "next_step", gymnasium's AutoresetMode.NEXT_STEP and its value "NextStep".
        mode = str(getattr(autoreset_mode, "value", autoreset_mode)).lower().replace("_", "")
        mode = {"nextstep": "next_step", "samestep": "same_step"}.get(mode, mode)
        if mode not in ("next_step", "same_step"):
            raise ValidationError(f"autoreset_mode must be 'next_step' or 'same_step', got {autoreset_mode!r}")
        self.sink = sink
        self.num_envs = num_envs
        self.mode = mode
        self.meta = meta or {}
        self.writers: list[EpisodeWriter | None] = [self._start(i, _index(initial_obs, i)) for i in range(num_envs)]

    def _start(self, i: int, obs: Any) -> EpisodeWriter:
        meta = self.meta(i) if callable(self.meta) else self.meta
        return EpisodeWriter(self.sink, obs, meta)

    def add_steps(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        infos: Mapping[str, Any] | None = None,
        extras: Any = None,
    ) -> None:
        """Record one ``env.step`` result for all envs (the batch the vector env returned)."""
        infos = infos or {}
        term = np.asarray(terminated, dtype=bool).reshape(self.num_envs)
        trunc = np.asarray(truncated, dtype=bool).reshape(self.num_envs)
        # Validate every env's row first so a rejected call changes nothing.
        plan: list[tuple[int, Any, Any]] = []
        for i in range(self.num_envs):
            obs_i = _index(observations, i)
            writer = self.writers[i]
            if writer is None or writer.done:  # next_step mode: this row is the reset
                plan.append((i, "reset", obs_i))
                continue
            ended = bool(term[i] or trunc[i])
            step_obs = obs_i
            if ended and self.mode == "same_step":
                if "final_obs" not in infos:
                    raise ValidationError(f"env {i}: same_step autoreset needs infos['final_obs']")
                step_obs = infos["final_obs"][i]
            step = {
                "observations": step_obs,
                "actions": _index(actions, i),
                "rewards": _index(rewards, i),
                "terminated": bool(term[i]),
                "truncated": bool(trunc[i]),
            }
            if extras is not None:
                step["extras"] = _index(extras, i)
            try:
                checked = writer.check_step(step)
            except ValidationError as exc:
                raise ValidationError(f"env {i}, {exc}") from exc
            plan.append((i, checked, obs_i if ended and self.mode == "same_step" else None))
        for i, checked, restart in plan:
            if checked == "reset":
                self.writers[i] = self._start(i, restart)
                continue
            self.writers[i]._apply(*checked)
            if restart is not None:
                self.writers[i] = self._start(i, restart)

    def close(self, finish_open: bool = False) -> None:
        """Discard (default) or finish the episodes still running in each env."""
        for w in self.writers:
            if w is not None and not w.done:
                if finish_open and w.length:
                    w.finish()
                else:
                    w.discard()


def _index(batch: Any, i: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: _index(v, i) for k, v in batch.items()}
    return batch[i]
