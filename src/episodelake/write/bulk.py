"""Bulk writes: whole episodes validated many at a time and committed in large, size-bounded batches.

Contracts (the promises of docs/writing.md, "Bulk writes"):

* A bulk call (:meth:`Dataset.append_episodes`, :meth:`Dataset.from_episodes`,
  the importers) makes one table commit per batch of :data:`BULK_EPISODES`
  episodes, or fewer when their bytes reach the writer's ``commit_bytes``
  or, on a capacity dataset, their steps or episodes reach 1/16 of the
  capacity (at least 1,024: ``Capacity.file_share``, so an eviction rewrites
  a small table file); the batch closes with the episode that reaches it. Finished episodes
  already pending join the first commit. The rest after the last full batch
  is treated like finished step episodes: committed at once when, with the
  pending ones, it fires a trigger (``commit_episodes``, ``commit_bytes``,
  ``commit_seconds``), else pending until the next one (a read, ``flush()``).
* A batch is committed only after every one of its episodes passed
  validation, and nothing of it is visible before its commit lands.
  Columnar calls (``lengths=``) validate every episode before the first
  commit: a rejected one leaves the dataset as it was. In a stream of dicts a
  rejected episode raises :class:`ValidationError` naming its index; batches
  the call committed before it stay, the rest of the call is not written, the
  episodes pending before the call stay pending.
* A killed process leaves only whole committed batches.
* Each validated batch passes the quality gate (:mod:`.gate`) before it is
  added: a rejected episode is refused like an invalid one (QualityError,
  a ValidationError, naming its index in the call).

Dicts are read in groups of up to :data:`GROUP_EPISODES`: each episode's
arrays are only collected (plain episodes) and the group is validated as
columns in one vectorized pass (:func:`checks.batch_from_columns`); when a
group fails, its episodes are checked one by one so the error names the
first bad episode exactly as :func:`checks.episode_from_dict` words it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import repeat
from operator import itemgetter
from typing import Any, TypeGuard, cast

import numpy as np

from ..core.checks import batch_from_columns, episode_from_dict
from ..core.constraints import check_constraints
from ..core.episode import EpisodeBatch, FinishedEpisode, batch_of, concat_batches, concat_rows, rows_for
from ..core.errors import ArgumentError, ValidationError
from ..core.schema import EPISODE_KEYS, DatasetSchema
from .commit import CommitSink
from .gate import admit, gated

BULK_EPISODES = 100_000
GROUP_EPISODES = 4096  # dict episodes validated per vectorized pass
CHECK_GROUP_BYTES = 256 << 20  # a dry run commits nothing: this bounds the dict bytes one pass holds instead
_PLAIN_KEYS = frozenset({"terminated", "truncated", "meta", *EPISODE_KEYS})
_FLAG_TYPES = frozenset({bool, np.bool_})  # what a plain episode's terminated/truncated may be


def append(sink: CommitSink, episodes: Iterable[Mapping[str, Any]] | Mapping[str, Any], lengths: Any = None) -> int:
    """Validate and write episodes in bulk (dicts, or columns with ``lengths``); returns how many."""
    with sink.lock:  # a read in another thread must not commit part of a batch
        batches = _Batches(sink)
        gate = gated(sink.store)
        for batch in _validated(sink.schema, episodes, lengths, sink.commit_bytes):
            batches.add(admit(sink.store, batch, _numbered(batches.seen)) if gate else batch)
        batches.finish()
        return batches.seen


def check(schema: DatasetSchema, episodes: Iterable[Mapping[str, Any]] | Mapping[str, Any], lengths: Any = None) -> int:
    """Validate episodes as :func:`append` does (the schema's constraints too, not the stored checks) and write
    nothing; returns how many it would append."""
    seen = 0
    for batch in _validated(schema, episodes, lengths, CHECK_GROUP_BYTES):
        check_constraints(schema, batch, _numbered(seen))
        seen += len(batch)
    return seen


def _numbered(first: int) -> Callable[[int], str]:
    """Names episode ``i`` of a batch whose first episode is the call's ``first``: ``"episode <first + i>"``."""
    return lambda i: f"episode {first + i}"


def _validated(
    schema: DatasetSchema, episodes: Iterable[Mapping[str, Any]] | Mapping[str, Any], lengths: Any, group_bytes: int
) -> Iterator[EpisodeBatch]:
    """The validated batches of an :func:`append` call, in order (ValidationError at the first bad episode)."""
    if lengths is None:
        if isinstance(episodes, Mapping):
            raise ArgumentError("append_episodes takes an iterable of episode dicts, or columns with lengths=")
        yield from _groups(schema, episodes, group_bytes)
    else:
        if not isinstance(episodes, Mapping):
            raise ArgumentError("with lengths=, append_episodes takes one mapping of concatenated columns")
        yield batch_from_columns(schema, episodes, lengths)


class _Batches:
    """Validated episodes on their way to commits of at most ``BULK_EPISODES`` episodes / ``commit_bytes``.

    On a capacity dataset a commit also holds at most the capacity's
    :meth:`~episodelake.storage.retention.Capacity.file_share` of episodes
    and steps, so that an eviction rewrites a small table file.
    """

    def __init__(self, sink: CommitSink) -> None:
        self.sink = sink
        self.fields = sink.schema.step_fields
        self.parts: list[EpisodeBatch] = []
        self.count = 0
        self.nbytes = 0
        self.steps = 0
        self.seen = 0
        capacity = sink.store.capacity
        episodes, steps = capacity.file_share() if capacity is not None else (None, None)
        self.max_episodes = BULK_EPISODES if episodes is None else min(episodes, BULK_EPISODES)
        self.max_steps = steps

    def add(self, batch: EpisodeBatch) -> None:
        """Take ``batch``; commit each batch that reaches a bound, closing it at the episode that does."""
        self.seen += len(batch)
        sizes = sum((batch.row_starts(f)[1:] - batch.row_starts(f)[:-1]) * f.step_bytes for f in self.fields)
        total = np.cumsum(np.asarray(sizes, dtype=np.int64) + np.zeros(len(batch), dtype=np.int64))
        steps = np.cumsum(batch.lengths, dtype=np.int64)
        a = 0
        while a < len(batch):
            room = self.sink.commit_bytes - self.nbytes
            b = min(_reach(total, a, room), a + self.max_episodes - self.count, len(batch))
            if self.max_steps is not None:
                b = min(b, _reach(steps, a, self.max_steps - self.steps))
            self.parts.append(batch.take(self.fields, a, b))
            self.count += b - a
            self.nbytes += int(total[b - 1]) - (int(total[a - 1]) if a else 0)
            self.steps += int(steps[b - 1]) - (int(steps[a - 1]) if a else 0)
            full = self.max_steps is not None and self.steps >= self.max_steps
            if full or self.count >= self.max_episodes or self.nbytes >= self.sink.commit_bytes:
                self._commit()
            a = b

    def _commit(self) -> None:
        self.sink.commit_batch(concat_batches(self.sink.schema, self.parts))
        self.parts, self.count, self.nbytes, self.steps = [], 0, 0, 0

    def finish(self) -> None:
        """The rest: committed now if it fires a trigger with the pending episodes, else queued behind them."""
        if not self.parts:
            return
        if self.sink.due(self.count, self.nbytes):
            self._commit()
        else:
            self.sink.submit_many(concat_batches(self.sink.schema, self.parts))
            self.parts = []


def _reach(total: np.ndarray, a: int, room: int) -> int:
    """The end of the run of episodes from ``a`` whose ``total`` (a running sum) first reaches ``room`` more."""
    before = int(total[a - 1]) if a else 0
    return int(np.searchsorted(total, before + room, side="left")) + 1


def _groups(schema: DatasetSchema, episodes: Iterable[Mapping[str, Any]], group_bytes: int) -> Iterator[EpisodeBatch]:
    """Validated batches of consecutive dict episodes (at most ``GROUP_EPISODES``, about ``group_bytes``)."""
    group: list[Mapping[str, Any]] = []
    first = nbytes = 0
    for i, ep in enumerate(episodes):
        if not group:
            first = i
        group.append(ep)
        nbytes += _raw_bytes(ep)
        if len(group) >= GROUP_EPISODES or nbytes >= group_bytes:
            yield _validate_group(schema, group, first)
            group, nbytes = [], 0
    if group:
        yield _validate_group(schema, group, first)


def _raw_bytes(ep: Any) -> int:
    """Bytes of an episode's arrays as given (bounds the memory a group holds; 0 for a non-mapping)."""
    if type(ep) is not dict and not _is_mapping(ep):
        return 0
    out = 0
    for value in ep.values():
        kind = type(value)  # type() tests: this runs once per episode of a dict import
        if kind is np.ndarray:
            out += value.nbytes
        elif kind is dict:
            out += sum(getattr(v, "nbytes", 0) for v in value.values())
        elif isinstance(value, np.ndarray):
            out += value.nbytes
    return out


def _rows(value: Any) -> int:
    """The leading length of an episode's array (-1 for a scalar); ``.shape`` first, as np.shape costs a microsecond."""
    shape = value.shape if type(value) is np.ndarray else np.shape(value)
    return shape[0] if shape else -1


def _all_rows(values: list[Any]) -> np.ndarray:
    """:func:`_rows` of each value; ``len`` (a C call) unless a value has no length (a scalar, a 0-d array)."""
    try:
        return np.fromiter(map(len, values), np.int64, len(values))
    except TypeError:
        return np.fromiter(map(_rows, values), np.int64, len(values))


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, fast for the common arrays and dicts (ABC checks cost a microsecond)."""
    return not isinstance(value, np.ndarray) and (type(value) is dict or isinstance(value, Mapping))


def _validate_group(schema: DatasetSchema, group: list[Mapping[str, Any]], first: int) -> EpisodeBatch:
    """One vectorized validation of ``group``; on failure the first bad episode is named (its own check)."""
    plain = _as_columns(schema, group)
    if plain is not None:
        try:
            return batch_from_columns(schema, *plain)
        except ValidationError:
            pass  # find and name the episode below
    finished: list[FinishedEpisode] = [
        episode_from_dict(schema, ep, f"episode {first + i}") for i, ep in enumerate(group)
    ]
    if plain is not None:  # each episode passes alone but not together: should not happen; say so
        raise ValidationError(f"episodes {first}..{first + len(group) - 1} pass one by one but not as a batch")
    return batch_of(schema, finished)


def _as_columns(schema: DatasetSchema, group: list[Mapping[str, Any]]) -> tuple[dict[str, Any], np.ndarray] | None:
    """``group`` as concatenated columns and lengths, or None unless every episode is plain.

    Plain: a mapping with only the keys of the columnar form (no ``initial_observation``), scalar flags,
    every role given with exactly the schema's fields, known meta fields. Anything else takes the
    episode-by-episode path, whose errors are the reference. (This is the hot path of dict imports:
    each key is read for the whole group with ``map`` over C functions, no Python call per episode.)
    """
    roles = [(key, [f.name for f in schema.role_fields(role)]) for key, role in EPISODE_KEYS.items()]
    roles = [(key, names) for key, names in roles if names]
    if "actions" not in dict(roles):
        return None
    if set(map(type, group)) == {dict}:
        episodes = cast("list[dict[str, Any]]", group)
    elif all(map(_is_mapping, group)):
        episodes = [dict(ep) for ep in group]
    else:
        return None
    if not all(map(_PLAIN_KEYS.issuperset, episodes)):
        return None
    collected: dict[str, list[list[Any]]] = {}
    for key, names in roles:
        fields = _role_values(list(map(dict.get, episodes, repeat(key))), names)
        if fields is None:
            return None  # absent, nested or incomplete: the reference path fills defaults or names it
        collected[key] = fields
    flags = [list(map(dict.get, episodes, repeat(name), repeat(False))) for name in ("terminated", "truncated")]
    if not all(_FLAG_TYPES.issuperset(map(type, flag)) for flag in flags):
        return None
    meta = _meta_lists(schema, list(map(dict.get, episodes, repeat("meta"))))
    if meta is None:
        return None
    steps = _all_rows(collected["actions"][0])
    for key, role in EPISODE_KEYS.items():
        if key not in collected:
            continue
        want = rows_for(schema.role_fields(role)[0], steps)
        for lst in collected[key]:
            if not np.array_equal(_all_rows(lst), want):  # also catches errors that cancel out in the totals
                return None
    try:
        columns: dict[str, Any] = {
            key: {n: concat_rows(lst) for n, lst in zip(names, collected[key], strict=True)} for key, names in roles
        }
    except ValueError:  # ragged shapes: the reference path names the episode
        return None
    for key, role in EPISODE_KEYS.items():
        if key in columns and schema.unwrapped(role):
            columns[key] = next(iter(columns[key].values()))
    columns.update(terminated=np.array(flags[0]), truncated=np.array(flags[1]), meta=meta)
    return columns, steps


def _role_values(values: list[Any], names: list[str]) -> list[list[Any]] | None:
    """Per field of a role, the group's arrays (``values``: the role's value in each episode), or None.

    A role of one field may be its array; any role may be a mapping holding exactly its fields.
    """
    kinds = set(map(type, values))
    if len(names) == 1 and kinds == {np.ndarray}:
        return [values]
    if kinds == {dict}:
        if set(map(len, values)) != {len(names)}:
            return None
        try:
            return [list(map(itemgetter(n), values)) for n in names]
        except KeyError:
            return None
    out: list[list[Any]] = [[] for _ in names]
    for value in values:
        if len(names) == 1 and isinstance(value, np.ndarray):
            out[0].append(value)
        elif _is_mapping(value) and len(value) == len(names) and all(n in value for n in names):
            for n, lst in zip(names, out, strict=True):
                lst.append(value[n])
        else:
            return None
    return out


def _meta_lists(schema: DatasetSchema, given: list[Any]) -> dict[str, list[Any]] | None:
    """Each meta field's value per episode (None: unset) from each episode's ``meta`` (``given``); None when an
    episode names a field the schema lacks."""
    names = [f.name for f in schema.meta_fields]
    if not any(given):
        return {n: [None] * len(given) for n in names}
    meta: dict[str, list[Any]] = {n: [] for n in names}
    for values in given:
        if values and not all(n in meta for n in values):
            return None
        for n, lst in meta.items():
            lst.append(values.get(n) if values else None)
    return meta
