"""Capacity and FIFO eviction: which committed episodes a commit removes to make room for its new ones.

A dataset created with ``capacity=`` keeps at most that many steps and/or
episodes. Each commit adds its episodes and removes the oldest ones in episode
order (``(created_at, episode_id)``, the order of positions) in one Delta
commit (:meth:`EpisodeTable.commit`), so no version is ever over capacity
after a commit or shows an eviction without its episodes. An episode that
does not fit even on its own (or that the same commit would evict) is never
added. The :class:`Capacity` is stored in the dataset descriptor, so every
process that opens the dataset enforces it.

The planner keeps the live episode order of the version it last committed, so
a writer alone on its dataset reads the table once, not at every commit; any
other version (another writer's commit, a compaction, a delete) is reread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.errors import ArgumentError
from ..core.mappings import from_mapping
from .table import MIN_RETENTION_HOURS, EpisodeTable

ORDER_COLUMNS = ["created_at", "episode_id", "length"]
FILE_SHARES = 16  # a full buffer spans at least this many table files: an eviction rewrites one of them
MIN_SHARE = 1024  # episodes or steps: below this a bulk import is not split for the sake of evictions


@dataclass(frozen=True)
class Capacity:
    """The most episodes/steps a dataset keeps, and how long evicted data stays for time travel.

    ``steps``/``episodes``: the limits (None: no limit of that kind; at least
    one is set). ``keep_versions``: with ``retention_hours=None`` (the
    default), the automatic vacuum keeps the files of the last
    ``keep_versions`` table versions whole (time travel to them and readers
    pinned to them read them exactly) and reclaims everything older, counted in
    commits, not time, so the disk a buffer takes stays bounded by its
    capacity whatever the commit rate (docs/replay.md, "Disk use").
    ``retention_hours`` (a number): the time window instead: evicted and
    deleted data older than this are removed by the automatic vacuum (versions
    before an eviction stay readable until then); below
    :data:`~episodelake.table.MIN_RETENTION_HOURS` (1 h; 0: at the next
    automatic vacuum) it needs ``break_old_versions=True``, which accepts that
    readers pinned to a version older than that, and time travel to it, fail.
    ``vacuum_every``: the automatic vacuum runs after at most that many
    commits of a writing ``Dataset`` on local disk, and with the version window
    also after every eighth of the buffer rewritten (object stores:
    ``ds.maintenance.vacuum()`` is explicit).
    """

    steps: int | None = None
    episodes: int | None = None
    retention_hours: float | None = None
    vacuum_every: int = 64
    break_old_versions: bool = False
    keep_versions: int = 16

    def __post_init__(self) -> None:
        for name in ("steps", "episodes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ArgumentError(f"capacity {name} must be a positive int or None, got {value!r}")
        if self.steps is None and self.episodes is None:
            raise ArgumentError("capacity needs steps and/or episodes")
        hours = self.retention_hours
        if hours is not None and (isinstance(hours, bool) or not isinstance(hours, int | float) or not hours >= 0):
            raise ArgumentError(f"capacity retention_hours must be a number >= 0 or None, got {hours!r}")
        if not isinstance(self.break_old_versions, bool):
            raise ArgumentError(f"capacity break_old_versions must be a bool, got {self.break_old_versions!r}")
        if hours is not None and hours < MIN_RETENTION_HOURS and not self.break_old_versions:
            raise ArgumentError(
                f"capacity retention_hours={hours} is below the safe minimum of {MIN_RETENTION_HOURS:g} h: the "
                "automatic vacuum would remove evicted episodes that readers pinned to a version less than "
                f"{MIN_RETENTION_HOURS:g} h old still read (and time travel to it); "
                "pass break_old_versions=True to accept that"
            )
        for name in ("vacuum_every", "keep_versions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"capacity {name} must be a positive int, got {value!r}")

    @classmethod
    def parse(cls, value: Capacity | int | Mapping[str, Any] | None) -> Capacity | None:
        """``capacity=`` as given to ``Dataset.create``: an int (steps), a mapping of the fields, or a Capacity."""
        if value is None or isinstance(value, Capacity):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(steps=value)
        if isinstance(value, Mapping):
            return from_mapping(cls, value, "capacity")
        raise ArgumentError(f"capacity must be an int (steps), a dict or el.Capacity, got {type(value).__name__}")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Capacity:
        """The capacity a dataset descriptor records. A descriptor written before ``break_old_versions``
        existed (0.2) may hold a shorter retention, chosen when no override was asked: it stands. One written
        before the version window (0.8 and older) records a number of hours: its time window stands too."""
        fields = dict(obj)
        hours = fields.setdefault("retention_hours", 1.0)  # written before 0.2 recorded it: 0.2's default
        if "break_old_versions" not in fields and isinstance(hours, int | float) and hours < MIN_RETENTION_HOURS:
            fields["break_old_versions"] = True
        return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def file_share(self) -> tuple[int | None, int | None]:
        """The most (episodes, steps) one table commit of many episodes should hold (None: no bound).

        An eviction rewrites the table file holding the oldest episodes
        without them (:meth:`EpisodeTable.commit`); a bulk import that filled
        the buffer in one file would make every eviction rewrite the whole
        table. Files of at most 1/:data:`FILE_SHARES` of the capacity (but
        never fewer than :data:`MIN_SHARE` episodes or steps: a small buffer's
        import stays one commit) keep each eviction's rewrite that small.
        """
        episodes = None if self.episodes is None else max(MIN_SHARE, self.episodes // FILE_SHARES)
        steps = None if self.steps is None else max(MIN_SHARE, self.steps // FILE_SHARES)
        return episodes, steps


def evict_count(lengths: np.ndarray, capacity: Capacity) -> int:
    """How many of the oldest episodes (``lengths`` in episode order) go so that the rest fit ``capacity``."""
    n = len(lengths)
    k = 0 if capacity.episodes is None else max(0, n - capacity.episodes)
    if capacity.steps is not None:
        cum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        k = max(k, int(np.searchsorted(cum, cum[-1] - capacity.steps, side="left")))
    return k


class _Order:
    """Episodes of one version in episode order: ``created_at`` (µs), ``episode_id``, ``length``."""

    def __init__(self, version: int, created: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> None:
        self.version, self.created, self.ids, self.lengths = version, created, ids, lengths

    @classmethod
    def of(cls, version: int, tbl: pa.Table) -> _Order:
        created = tbl["created_at"].combine_chunks().cast(pa.int64()).to_numpy()
        ids = tbl["episode_id"].to_numpy()
        lengths = tbl["length"].to_numpy()
        order = np.lexsort((ids, created))
        return cls(version, created[order], ids[order], lengths[order])


class Evictor:
    """Plans each commit of a capacity dataset: the rows to add and the episode ids to remove."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self._live: _Order | None = None  # the episode order at a version this evictor committed
        self._planned: _Order | None = None  # what the last plan leaves, at the version it was planned on

    def plan(self, table: EpisodeTable, rows: pa.Table) -> tuple[pa.Table, list[int]]:
        """At ``table``'s version: ``rows`` that stay (all but those evicted at once) and the ids evicted."""
        live = self._live
        if live is None or live.version != table.version:
            live = _Order.of(table.version, table.read(ORDER_COLUMNS))
        new = _Order.of(table.version, rows.select(ORDER_COLUMNS))
        created = np.concatenate([live.created, new.created])
        ids = np.concatenate([live.ids, new.ids])
        lengths = np.concatenate([live.lengths, new.lengths])
        order = np.lexsort((ids, created))
        k = evict_count(lengths[order], self.capacity)
        gone, kept = order[:k], order[k:]
        self._planned = _Order(table.version, created[kept], ids[kept], lengths[kept])
        gone_ids, from_live = ids[gone], gone < len(live.ids)
        if not from_live.all():  # new episodes that do not fit are never added
            rows = rows.filter(pc.invert(pc.is_in(rows["episode_id"], pa.array(gone_ids[~from_live]))))
        return rows, gone_ids[from_live].tolist()

    def committed(self, version: int) -> None:
        """The last plan was committed as ``version``: keep its order if nothing else landed in between."""
        planned = self._planned
        self._live = planned if planned is not None and version == planned.version + 1 else None
        if self._live is not None:
            self._live.version = version
        self._planned = None


def check_ids(ids: Any) -> np.ndarray:
    """``episode_ids`` given to ``delete`` as an int64 array (ArgumentError naming a bad entry)."""
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise ArgumentError(f"episode_ids must be a sequence of ints, got {type(ids).__name__}")
    out = []
    for i, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ArgumentError(f"episode_ids[{i}] must be an int, got {value!r}")
        out.append(int(value))
    return np.unique(np.array(out, dtype=np.int64))
