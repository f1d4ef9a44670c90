"""``segments()`` as a Grain random-access data source (``grain.DataLoader``, ``grain.MapDataset``).

Grain treats records as trees of arrays and batches them leaf by leaf, so a
:class:`~episodelake.segment_dataset.SegmentDataset` item (a ``Segment``,
indexed by field keys, never by position) cannot be batched as it is
(``TypeError: Segment keys are str (e.g. 'observation/state'), got 0``).
:class:`GrainSource` gives Grain plain ``dict[str, np.ndarray]`` records
instead: every buffer of the segment by key (observation fields hold
``L + 1`` rows: ``obs`` is ``[:-1]``, ``next_obs`` ``[1:]``), ``terminated``,
``truncated``, ``mask`` ``[L]``, ``episode_id``, ``start``, ``meta/<name>``
and ``meta_mask/<name>`` (``str`` meta as a NumPy ``str_`` scalar, ``""``
where unset). ``grain`` itself is never imported here: the source is a plain
object with Grain's ``RandomAccessDataSource`` surface (``__len__``,
``__getitem__``, and ``_getitems`` for Grain's batched reads), picklable for
Grain's worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def batch_to_dict(batch: Any) -> dict[str, np.ndarray]:
    """A SegmentBatch as one ``dict[str, np.ndarray]`` with a leading batch axis (keys: see the module)."""
    out: dict[str, np.ndarray] = {}
    for key, value in batch.buffers().items():
        arr = np.asarray(value)
        if arr.dtype == object:
            arr = np.array(["" if v is None else str(v) for v in arr.tolist()], dtype=np.str_)
        out[key] = arr.view(np.ndarray)
    out["episode_id"] = np.asarray(batch.episode_id, np.int64)
    out["start"] = np.asarray(batch.start, np.int64)
    return out


class GrainSource:
    """Grain's random-access data source over a ``ds.segments(window)`` (or any SegmentDataset).

    ``source[i]`` is segment ``i`` as a dict of arrays; ``source._getitems(ids)``
    reads them all with one planned read (the records Grain asks for together)
    and ``source.read_batch(ids)`` returns them already batched (one dict of
    ``[B, ...]`` arrays). Records are deterministic functions of the index, so
    Grain's seeded ``IndexSampler`` and iterator state (``get_state`` /
    ``set_state``) make a loader resume exactly.
    """

    def __init__(self, segments: Any) -> None:
        self.segments = segments

    def __len__(self) -> int:
        return len(self.segments)

    def read_batch(self, ids: Sequence[int]) -> dict[str, np.ndarray]:
        """The segments ``ids`` as one dict of batched arrays (``[len(ids), ...]``)."""
        n = len(self)
        ids = [int(i) for i in ids]
        for i in ids:
            if not -n <= i < n:
                raise IndexError(f"segment index {i} out of range for {n} segments")
        return batch_to_dict(self.segments._read([i % n for i in ids]))

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"segment index must be an int, got {type(i).__name__}")
        return {k: v[0, ...] for k, v in self.read_batch([int(i)]).items()}

    def _getitems(self, ids: Sequence[int]) -> list[dict[str, np.ndarray]]:
        batch = self.read_batch(ids)
        return [{k: v[j, ...] for k, v in batch.items()} for j in range(len(ids))]  # 0-d arrays, not scalars

    __getitems__ = _getitems

    def __repr__(self) -> str:
        return f"GrainSource({self.segments!r})"
