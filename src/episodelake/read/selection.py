"""Which episodes a sampler draws from, and how often: ``where``/``filter`` selection and episode weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import ArgumentError
from .collection import EpisodeCollection
from .snapshot import Snapshot


def select(
    collection: EpisodeCollection, where: str | None = None, filter: Callable[[Any], bool] | None = None
) -> tuple[Snapshot, np.ndarray]:
    """``collection`` narrowed by a SQL predicate and/or a per-episode predicate.

    ``filter`` receives each episode's ``EpisodeRef`` (``episode_id``,
    ``length``, ``terminated``, ``truncated``, ``meta``) and returns a bool.
    Returns ``(snapshot, positions)``.
    """
    if where is not None:
        collection = collection.where(where)
    snap = collection.snapshot()
    positions = np.asarray(collection.positions, dtype=np.int64)
    if filter is not None:
        if not callable(filter):
            raise ArgumentError(f"filter must be callable, got {type(filter).__name__}")
        keep = np.fromiter((bool(filter(ref)) for ref in collection.episodes()), bool, len(positions))
        positions = positions[keep]
    return snap, positions


def episode_weights(collection: EpisodeCollection, snap: Snapshot, positions: np.ndarray, weights: Any) -> np.ndarray:
    """Per-episode sampling weights aligned with ``positions``.

    ``weights`` is a SQL expression over the ``episodes`` view (``"return"``,
    ``"CASE WHEN success THEN 4 ELSE 1 END"``), a SQL query returning
    ``episode_id`` and ``weight`` columns (episodes it omits get weight 0),
    or one number per episode of ``collection`` (before any ``where``/``filter``).
    SQL runs sandboxed (it reads nothing but the dataset; else QueryError).
    """
    if not isinstance(weights, str):
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(collection.positions),):
            raise ArgumentError(
                f"weights: expected one value per episode ({len(collection.positions)}), got shape {w.shape}"
            )
        by_pos = dict(zip(collection.positions.tolist(), w.tolist(), strict=True))
        return np.array([by_pos[p] for p in positions.tolist()], dtype=np.float64)
    text = weights.strip()
    if text.split(None, 1)[0].lower() in ("select", "with", "from"):
        query = text
    else:
        query = f"SELECT episode_id, CAST(({text}) AS DOUBLE) AS weight FROM episodes"
    # configs and command lines carry weights: read nothing else (a sandboxed query always has rows)
    cols = collection.sql(query, sandbox=True).fetchnumpy()
    if "episode_id" not in cols or "weight" not in cols:
        raise ArgumentError(f"weights query must return episode_id and weight columns, got {sorted(cols)}")
    by_id = dict(zip(cols["episode_id"].tolist(), cols["weight"].tolist(), strict=True))
    ids = snap.index["episode_id"][positions].tolist()
    return np.array([np.nan if by_id.get(i, 0.0) is None else by_id.get(i, 0.0) for i in ids], dtype=np.float64)
