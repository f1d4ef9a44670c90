"""What every importer shares: the format table, field inference from arrays, the write loop, action alignment."""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from ..core.errors import ArgumentError, ValidationError
from ..core.progress import track
from ..core.schema import DatasetSchema, FieldSpec
from ..dataset import Dataset
from .report import ACTIVE, ImportReport, finish, gated_write, path_bytes, source_name

FORMATS = {
    "minari": "minari",
    "d4rl": "d4rl",
    "memmap-replay": "memmap_replay",
    "episodata": "episodata",
    "lerobot": "lerobot",
    "rosbag": "rosbag",
}
SOURCE_EPISODE = FieldSpec("source_episode", (), "int64", role="meta", description="episode index or id in the source")


def import_dataset(format: str, src: Any, dst: str | None = None, **options: Any) -> Dataset:
    """Import ``src`` in ``format`` (see :data:`FORMATS`) into a new dataset at ``dst``."""
    if format not in FORMATS:
        raise ArgumentError(f"unknown import format {format!r}; known: {sorted(FORMATS)}")
    module = importlib.import_module(f".{FORMATS[format]}", __package__)
    return module.load(src, dst, **options)


def import_report(
    format: str, src: Any, dst: str | None = None, *, dry_run: bool = False, on_reject: str = "skip", **options: Any
) -> ImportReport:
    """Import like :func:`import_dataset`, judged by the new dataset's quality gate as it goes, and report.

    See :mod:`episodelake.importers.report`: rejected episodes are left out and counted (``on_reject="skip"``)
    or end the import (``"raise"``); ``dry_run=True`` converts and validates everything and writes nothing.
    Returns the :class:`~episodelake.importers.report.ImportReport` (its ``dataset`` None on a dry run).
    """
    report = ImportReport(format, source_name(src), None if dry_run else dst, dry_run=dry_run, on_reject=on_reject)
    report.bytes_in = path_bytes(src)
    token = ACTIVE.set(report)
    try:
        ds = import_dataset(format, src, None if dry_run else dst, **options)
    finally:
        ACTIVE.reset(token)
    if not dry_run:
        report.dataset = ds
        report.destination = ds.location.url
    return report


def fields_from_arrays(arrays: Mapping[str, np.ndarray], role: str, per_step: bool = True) -> list[FieldSpec]:
    """FieldSpecs for named arrays (leading time/episode axis dropped when ``per_step``)."""
    return [
        FieldSpec(name, tuple(a.shape[1:]) if per_step else tuple(a.shape), a.dtype, role=role)
        for name, a in arrays.items()
    ]


def write_import(
    schema: DatasetSchema,
    episodes: Iterable[Mapping[str, Any]],
    dst: str | None,
    *,
    info: Mapping[str, Any],
    total: int | None,
    desc: str,
    progress: bool | None,
    **create_options: Any,
) -> Dataset:
    """Create the destination, append ``episodes`` in bulk with a progress bar, commit; all or nothing.

    One bulk call: one table commit per large, size-bounded batch (see
    :mod:`episodelake.bulk`), so an import costs a few commits, not one per
    handful of episodes.
    """
    report = ACTIVE.get()
    if report is not None:
        return _reported_import(report, schema, episodes, dst, info, total, desc, progress, create_options)
    ds = Dataset.create(schema, dst, info=info, **create_options)
    with _all_or_nothing(ds):
        ds.append_episodes(track(episodes, total, desc, progress, unit="episode"))
    return ds


@contextlib.contextmanager
def _all_or_nothing(ds: Dataset) -> Iterator[None]:
    """Run the block's writes into the new dataset ``ds``, then flush; on any failure discard and remove it whole."""
    try:
        yield
        ds.flush()
    except BaseException:
        ds.flush(discard=True)  # pending episodes must not be committed later (atexit flush)
        ds.location.fs.rm(ds.location.path, recursive=True)
        raise


def _reported_import(
    report: ImportReport,
    schema: DatasetSchema,
    episodes: Iterable[Mapping[str, Any]],
    dst: str | None,
    info: Mapping[str, Any],
    total: int | None,
    desc: str,
    progress: bool | None,
    create_options: Mapping[str, Any],
) -> Dataset:
    """:func:`write_import` under :func:`import_report`: gated chunk by chunk, counted; a dry run writes nothing."""
    started = time.perf_counter()
    tracked = track(episodes, total, desc, progress, unit="episode")
    if report.dry_run:
        gated_write(None, schema, tracked, report)
        ds = Dataset.create(schema, None, info=info)  # empty, in memory: what the caller gets
        finish(report, info, None, started)
        return ds
    ds = Dataset.create(schema, dst, info=info, **create_options)
    with _all_or_nothing(ds):
        gated_write(ds, schema, tracked, report)
    finish(report, info, ds, started)
    return ds


def action_out_episode(
    observations: Mapping[str, np.ndarray],
    actions: Mapping[str, np.ndarray],
    rewards: Mapping[str, np.ndarray],
    *,
    next_observations: Mapping[str, np.ndarray] | None = None,
    extras: Mapping[str, np.ndarray] | None = None,
    terminated: bool = False,
    truncated: bool = False,
    meta: Mapping[str, Any] | None = None,
    strict: bool = True,
    where: str = "episode",
    first_row: int = 0,
) -> dict[str, Any] | None:
    """Convert one action-out run of ``n`` rows into a dict-form (action-in) episode.

    Row ``t`` of every array is the step taken at observation ``t``. With
    ``next_observations`` (what each action produced) all ``n`` transitions
    are kept: observation row ``t + 1`` is ``observations[t + 1]`` inside the
    run and ``next_observations[n - 1]`` at its end; ``strict`` checks that
    ``next_observations[t] == observations[t + 1]`` and names the first row
    that differs.

    Without them the last row's action produced an observation nobody
    recorded, and the end flag decides (see :func:`kept_transitions`):

    * ``terminated``: all ``n`` transitions are kept, the terminal reward
      included; the final observation row repeats observation ``n - 1``. A
      terminal transition's next observation is never bootstrapped from, so
      no outcome and no training target is invented.
    * ``truncated`` or neither flag: the last transition is dropped and the
      episode (``n - 1`` transitions) keeps its flag: it really was cut short
      at observation ``n - 1``, which is recorded, so bootstrapping from it is
      correct. Returns None when nothing is left (``n == 1``).

    ``terminated`` wins over ``truncated``. Errors name rows as
    ``first_row + t`` (the run's position in its source).
    """
    n = len(next(iter(rewards.values())))
    length = kept_transitions(n, terminated, next_observations is not None)
    if length == 0:
        return None
    if next_observations is not None:
        if strict:
            for k, nxt in next_observations.items():
                same = _rows_equal(nxt[:-1], observations[k][1:])
                if not same.all():
                    bad = first_row + int(np.flatnonzero(~same)[0])
                    raise ValidationError(
                        f"{where}, row {bad}: next_observations {k!r} differs from the observation of row {bad + 1}; "
                        "pass strict=False to take the observations as the truth"
                    )
        obs = {k: np.concatenate([v, next_observations[k][-1:]]) for k, v in observations.items()}
    elif length == n:  # terminal without its next observation: a placeholder row that nothing bootstraps from
        obs = {k: np.concatenate([v, v[-1:]]) for k, v in observations.items()}
    else:
        obs = dict(observations)
    episode: dict[str, Any] = {
        "observations": obs,
        "actions": {k: v[:length] for k, v in actions.items()},
        "rewards": {k: v[:length] for k, v in rewards.items()},
        "terminated": bool(terminated),
        "truncated": bool(truncated) and not terminated,
        "meta": dict(meta or {}),
    }
    if extras:
        episode["extras"] = {k: v[:length] for k, v in extras.items()}
    return episode


def kept_transitions(n: int, terminated: bool, has_next_observations: bool) -> int:
    """Transitions an action-out run of ``n`` rows keeps: ``n`` with next observations or when it ends
    terminated (its final next observation is never used), else ``n - 1`` (the last one has no next observation).
    """
    return n if has_next_observations or terminated else n - 1


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row equality (NaN equals NaN) of two arrays with a leading row axis."""
    a2, b2 = a.reshape(len(a), int(np.prod(a.shape[1:]))), b.reshape(len(b), int(np.prod(b.shape[1:])))
    eq = a2 == b2
    if a.dtype.kind in "fc":
        eq |= np.isnan(a2) & np.isnan(b2)
    return eq.all(axis=1)
