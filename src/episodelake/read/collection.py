"""The collection contract: what every reader below the façade may ask of a Dataset or a DatasetView.

An :class:`EpisodeCollection` is some episodes of one pinned snapshot: a whole
dataset (``positions`` are all of its snapshot's) or a view (a subset, pinned
to the snapshot it was chosen from). Query, selection, sampling, Ray, the
exporters and the plots read collections through these public members only;
how the façade keeps them is its own affair.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from ..core.schema import DatasetSchema
from .snapshot import Snapshot


class EpisodeCollection(Protocol):
    """Some episodes of one snapshot: a :class:`~episodelake.Dataset` or a :class:`~episodelake.DatasetView`.

    ``positions`` are distinct snapshot positions in episode order, so a
    collection holding as many episodes as its snapshot holds all of them. A
    dataset, which can move to a newer version, has a ``refresh()`` returning
    itself and always holds every episode of its snapshot (:func:`subset`);
    a view chosen by ``where``/``select_episodes`` may record those steps as
    ``selection`` (:func:`selection`).
    """

    @property
    def schema(self) -> DatasetSchema: ...

    def snapshot(self) -> Snapshot:
        """The snapshot the collection's positions index (a Dataset commits its handed-over episodes first)."""
        ...

    @property
    def positions(self) -> np.ndarray: ...

    @property
    def episode_ids(self) -> np.ndarray: ...

    @property
    def info(self) -> dict[str, Any]:
        """The descriptor's ``info`` of the dataset the episodes belong to."""
        ...

    def __len__(self) -> int: ...

    def episodes(self) -> Iterator[Any]:
        """An ``EpisodeRef`` per episode, in episode order."""
        ...

    def where(self, predicate: str, params: Any = None) -> EpisodeCollection: ...

    def sql(self, query: str, params: Any = None, sandbox: bool = False) -> Any:
        """A lazy ``SQLResult`` of ``query`` over the collection's ``episodes``/``steps`` views (None: a command)."""
        ...


def subset(collection: EpisodeCollection, snap: Snapshot) -> np.ndarray | None:
    """``collection``'s positions when it holds fewer episodes than ``snap``, else None (all of them).

    ``snap`` is the snapshot a read runs on. A dataset holds all of any
    snapshot it reads, so it is answered without reading one (its
    ``positions`` would scan the table's index, which plain SQL never needs).
    """
    if callable(getattr(collection, "refresh", None)):
        return None
    positions = collection.positions
    return positions if len(positions) < snap.num_episodes else None


def selection(collection: EpisodeCollection, snap: Snapshot) -> tuple[dict[str, Any], ...] | None:
    """The ``where``/``select_episodes`` steps that chose ``collection`` from ``snap`` (stream lineage).

    The steps a view recorded; else ``()`` for a collection of all the
    snapshot's episodes, None for a subset chosen by unrecorded means.
    """
    recorded: tuple[dict[str, Any], ...] | None = getattr(collection, "selection", None)
    if recorded is not None:
        return recorded
    return () if subset(collection, snap) is None else None
