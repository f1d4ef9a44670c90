"""Episodes as a Rerun recording (``.rrd``) that ``rerun path.rrd`` opens: ``el.to_rerun(ds_or_view, path)``.

Each episode is the entity tree ``episodes/<episode_id>/``: every camera
field (:func:`~episodelake.exporters.lerobot.is_camera`) as an image per
frame, every small per-step numeric field (:func:`is_series`) as a scalar time
series (one series per channel), all on the ``step`` timeline (a step's
observation, then its action and reward, at the step's index; the last
observation at ``length``), and the episode's columns (meta, flags, return)
as a static JSON text document at ``episodes/<episode_id>/columns``. Written
with rerun-sdk (the ``rerun`` extra), read back in tests/test_viewer.py with
rerun's own ``RrdReader``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import ArgumentError, MissingDependencyError
from .lerobot import is_camera

if TYPE_CHECKING:
    from ..core.schema import FieldSpec
    from ..read.collection import EpisodeCollection

SERIES_MAX_CHANNELS = 16  # more numbers per step (images, big states) are not a readable time series


def is_series(f: FieldSpec) -> bool:
    """A per-step field shown as time series (viewer plots, Rerun scalars): numeric, at most 16 numbers a step."""
    return (
        not is_camera(f)
        and np.dtype(f.np_dtype).kind in "biuf"
        and int(np.prod(f.shape, dtype=np.int64)) <= SERIES_MAX_CHANNELS
    )


def episode_columns(collection: EpisodeCollection) -> list[str]:
    """The ``episodes`` view's columns a person reads: id, length, flags, return, ``created_at``, meta, derived.

    Per-step list columns and the table's bookkeeping (``writer``, ``ref/``,
    ``crc/``, ``stats/``) are left out.
    """
    names = collection.sql("SELECT * FROM episodes LIMIT 0", sandbox=True).columns
    steps = {f.key for f in collection.schema.step_fields}
    return [c for c in names if c != "writer" and c not in steps and not c.startswith(("ref/", "crc/", "stats/"))]


def quoted(names: Iterable[str]) -> str:
    """SQL column names, double-quoted and comma-separated (keys hold ``/``)."""
    return ", ".join('"' + name.replace('"', '""') + '"' for name in names)


def episode_row(collection: EpisodeCollection, names: list[str], episode_id: int) -> dict[str, Any]:
    """The columns ``names`` of one episode of ``collection`` (KeyError: not among them), as Python values."""
    query = f"SELECT {quoted(names)} FROM episodes WHERE episode_id = ?"
    rows = collection.sql(query, [episode_id], sandbox=True).to_arrow_table().to_pylist()
    if not rows:
        raise KeyError(f"no episode with id {episode_id}")
    return rows[0]


def to_rerun(
    collection: EpisodeCollection,
    path: str | os.PathLike[str],
    episodes: Iterable[int] | None = None,
    *,
    application_id: str = "episodelake",
) -> int:
    """Write the chosen episodes of ``collection`` to a Rerun recording at ``path``; return how many.

    ``episodes``: episode ids of ``collection`` (default: every episode; an id
    that is not among them raises KeyError before anything is written).
    ``path`` is replaced if it exists. Needs rerun-sdk (``pip install
    'episodelake[rerun]'``).
    """
    try:
        import rerun as rr
    except ImportError as exc:
        raise MissingDependencyError("to_rerun needs rerun-sdk: pip install 'episodelake[rerun]'") from exc
    if not isinstance(path, str | os.PathLike):
        raise ArgumentError(f"path must be a file path, got {path!r}")
    ids = collection.episode_ids
    if episodes is None:
        chosen = ids
    else:
        chosen = np.asarray(list(episodes), dtype=np.int64)
        missing = sorted(set(chosen.tolist()) - set(ids.tolist()))
        if missing:
            raise KeyError(f"no episode with id {missing[0]} among these {len(ids)} episodes")
    wanted = set(chosen.tolist())
    fields = collection.schema.step_fields
    names = episode_columns(collection)
    rec = rr.RecordingStream(application_id)
    rec.save(os.fspath(path))
    written = 0
    for ep in collection.episodes():
        if ep.episode_id not in wanted:
            continue
        seg = ep.read()
        root = f"episodes/{ep.episode_id}"
        rec.log(
            f"{root}/columns",
            rr.TextDocument(json.dumps(episode_row(collection, names, ep.episode_id), default=str)),
            static=True,
        )
        for f in fields:
            values = seg.data[f.key]
            steps = rr.TimeColumn("step", sequence=np.arange(len(values)))
            if is_camera(f):
                frames = values if f.layout == "HWC" else values.transpose(0, 2, 3, 1)
                for t, image in enumerate(frames):
                    rec.set_time("step", sequence=t)
                    rec.log(f"{root}/{f.key}", rr.Image(np.ascontiguousarray(image)))
            elif is_series(f):
                series = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
                rec.send_columns(f"{root}/{f.key}", indexes=[steps], columns=rr.Scalars.columns(scalars=series))
        written += 1
    rec.flush()
    rec.disconnect()
    return written
