"""The map-style dataset of segments (``ds.segments(window)``), for PyTorch ``DataLoader``.

:class:`SegmentDataset` has ``len``/indexing over every valid segment
(:mod:`.segment_index`), a batched ``__getitems__`` that turns a whole loader
batch into one planned read, and ``collate``; picklable, so it runs in
``DataLoader`` workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..core.segments import Segment
from ..core.spellings import Refused
from ..core.transforms import Transform, apply_transforms, check_transforms
from ..read.batching import Buffers, reader_for
from ..read.collection import EpisodeCollection
from ..read.selection import select
from .batch import SegmentBatch, collate, unbatch
from .loader_slots import SlotBatch, loader_worker_slots, slot_bytes
from .options import Shard, Window, shard_of, window_of
from .segment_index import SegmentIndex


class SegmentDataset:
    """Every valid segment of a collection, indexable (PyTorch map-style dataset).

    ``dataset[i]`` is one :class:`Segment` (``[L, ...]``); ``__getitems__``
    (used by ``DataLoader`` with a batch size) reads a whole batch with one
    planned read and returns a :class:`SegmentBatch`, which :meth:`collate`
    passes through, so use ``collate_fn=segments.collate``. Picklable: spawn
    workers get the loaded index and small fields; forked workers share them.
    In ``DataLoader`` workers a batch's large buffers cross to the main
    process in shared memory (:mod:`~episodelake.sampling.loader_slots`) and
    raw local arrays are read through the page cache, which all workers share
    (:func:`~episodelake.read.batching.serve_loader_worker`).

    Args:
        collection: a Dataset or DatasetView.
        window: which segments: an :class:`~episodelake.options.Window`
            (length, pad, stride) or an int length.
        where / filter: narrow the episodes (see :func:`~episodelake.selection.select`).
        shard: ``(rank, world)`` or an :class:`~episodelake.options.Shard`:
            this rank's disjoint part of the segments.
        transform: field key -> :class:`~episodelake.transforms.FrameTransform`
            or a callable on the field's batch array, applied to each batch.
    """

    # episodata's members: refused with what to write instead (:mod:`episodelake.core.spellings`)
    fetch, refresh, segment_length = (Refused("SegmentDataset") for _ in range(3))

    def __init__(
        self,
        collection: EpisodeCollection,
        window: Window | int,
        where: str | None = None,
        filter: Callable[[Any], bool] | None = None,
        shard: Shard | Sequence[int] | None = None,
        transform: Mapping[str, Transform] | None = None,
    ) -> None:
        win, part = window_of(window), shard_of(shard)
        snap, positions = select(collection, where, filter)
        self.transforms = check_transforms(snap.schema, transform)
        lengths = snap.lengths[positions]
        shard_pair = None if part is None else (part.rank, part.world)
        self.index = SegmentIndex(positions, lengths, win.size, win.pad, win.stride, shard_pair)
        self.sequence_length, self.context_length = self.index.sequence_length, win.context
        self.reader = reader_for(snap)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Segment:
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"segment index must be an int, got {type(i).__name__}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"segment index {i} out of range for {n} segments")
        loader_worker_slots()  # in a DataLoader worker: set the process up as one
        return unbatch(self._read([int(i) % n]), 0)

    def __getitems__(self, ids: Sequence[int]) -> SegmentBatch:
        """The segments ``ids`` as one batch, read with one planned read.

        In a ``DataLoader`` worker the large buffers are gathered into shared
        memory and the batch crosses to the main process without copying its
        bytes (:mod:`~episodelake.sampling.loader_slots`); the main process gets
        the same :class:`SegmentBatch` it would read itself.
        """
        pool = loader_worker_slots()
        if pool is None:
            return self._read(ids)
        arena = pool.arena(slot_bytes(self.reader.pooled(len(ids), self.sequence_length)))
        return SlotBatch.of(self._read(ids, arena), arena.slot)

    def _read(self, ids: Sequence[int], buffers: Buffers | None = None) -> SegmentBatch:
        k, first = self.index.locate(np.asarray(ids, dtype=np.int64))
        seg = self.reader.segments(self.index.positions[k], first, self.sequence_length, buffers)
        apply_transforms(seg.data, self.reader.schema, self.transforms)
        return SegmentBatch.wrap(seg, self.context_length)

    collate = staticmethod(collate)

    def __repr__(self) -> str:
        return f"SegmentDataset({len(self)} segments of {self.sequence_length} transitions)"
