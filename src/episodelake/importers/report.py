"""What an import did (:class:`ImportReport`) and the gated write loop behind ``import_report`` / ``--dry-run``.

:func:`episodelake.importers.import_report` runs any importer with a report
active (a context variable the shared write loop reads, so no importer
changes): episodes are appended in chunks (at most :data:`CHUNK_EPISODES`
episodes or :data:`CHUNK_BYTES` bytes of arrays), each chunk committed with
one ``flush``. The quality gate of the new dataset (its schema's
``FieldSpec`` constraints and the ``checks=`` it is created with) judges
every chunk; with ``on_reject="skip"`` (default) an episode it rejects is
left out and counted under ``"rejected: <check>"`` and the import goes on
(the chunk's episodes committed before the rejection stay; the ones after
it are appended again), with ``"raise"`` the first rejection ends the
import as :func:`~episodelake.importers.import_dataset` does. Quarantined
episodes are committed and counted. An invalid episode (wrong shape or
dtype: a ValidationError that is not a quality rejection) always ends the
import.

``dry_run=True`` reads and converts the whole source and validates every
episode against the schema and its constraints, writing nothing: no
destination is created (checks stored with ``checks=`` need a table to run
in and are not judged; ``bytes_out`` is None).

Counts: ``episodes`` and ``steps`` appended (quarantined ones included),
``bytes_in`` (the source's files on disk, None when the source is not a
local path), ``bytes_out`` (the new dataset's files), ``skipped``: reason ->
count, from the importer (``info["source"]["skipped_episodes"]``, its
``"skipped"`` mapping) and the gate.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ArgumentError, QualityError

if TYPE_CHECKING:
    from ..dataset import Dataset

CHUNK_EPISODES = 1024
CHUNK_BYTES = 256 << 20
ON_REJECT = ("skip", "raise")

ACTIVE: contextvars.ContextVar[ImportReport | None] = contextvars.ContextVar("episodelake_import_report", default=None)


@dataclass
class ImportReport:
    """The summary of one import (see the module): counts, bytes, what was skipped and why, and the dataset."""

    format: str
    source: str
    destination: str | None
    dry_run: bool = False
    on_reject: str = "skip"
    episodes: int = 0
    steps: int = 0
    quarantined: int = 0
    bytes_in: int | None = None
    bytes_out: int | None = None
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    dataset: Dataset | None = None

    def to_json(self) -> dict[str, Any]:
        """The counts as plain JSON values (no dataset)."""
        return {
            "format": self.format,
            "source": self.source,
            "destination": self.destination,
            "dry_run": self.dry_run,
            "episodes": self.episodes,
            "steps": self.steps,
            "quarantined": self.quarantined,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
            "skipped": dict(self.skipped),
        }

    def __str__(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        lines = [
            f"{verb} {self.episodes} episodes ({self.steps} steps) from {self.format} {self.source}"
            + ("" if self.dry_run else f" to {self.destination}")
            + f" in {self.seconds:.1f} s"
        ]
        if self.quarantined:
            lines.append(f"quarantined: {self.quarantined}")
        sizes = [f"{name} {_size(v)}" for name, v in (("in", self.bytes_in), ("out", self.bytes_out)) if v is not None]
        if sizes:
            lines.append("bytes: " + ", ".join(sizes))
        for why, n in sorted(self.skipped.items()):
            lines.append(f"skipped {n}: {why}")
        return "\n".join(lines)

    def skip(self, why: str, n: int = 1) -> None:
        """Count ``n`` more things skipped for reason ``why``."""
        self.skipped[why] = self.skipped.get(why, 0) + n


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def source_name(src: Any) -> str:
    """How a report names its source: the path, or a list's first entry and how many more."""
    if isinstance(src, (list, tuple)) and src:
        return str(src[0]) + (f" (and {len(src) - 1} more)" if len(src) > 1 else "")
    return str(src)


def path_bytes(src: Any) -> int | None:
    """Bytes of the files at a local path (a file, or a folder recursively); None for anything else."""
    if isinstance(src, (list, tuple)):
        sizes = [path_bytes(s) for s in src]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)
    if not isinstance(src, (str, os.PathLike)):
        return None
    p = Path(os.fspath(src))
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return None


def _episode_bytes(episode: Mapping[str, Any]) -> int:
    total = 0
    for value in episode.values():
        if isinstance(value, Mapping):
            total += _episode_bytes(value)
        else:
            total += int(getattr(value, "nbytes", 0))
    return total


def _steps(episode: Mapping[str, Any]) -> int:
    rewards = episode.get("rewards")
    if isinstance(rewards, Mapping):
        rewards = next(iter(rewards.values()))
    return len(rewards) if rewards is not None else 0


def _chunks(episodes: Iterable[Mapping[str, Any]], most: int) -> Iterable[list[Mapping[str, Any]]]:
    chunk: list[Mapping[str, Any]] = []
    size = 0
    for episode in episodes:
        chunk.append(episode)
        size += _episode_bytes(episode)
        if len(chunk) >= most or size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def gated_write(
    ds: Dataset | None,
    schema: Any,
    episodes: Iterable[Mapping[str, Any]],
    report: ImportReport,
    *,
    chunk_episodes: int = CHUNK_EPISODES,
) -> None:
    """Append ``episodes`` to ``ds`` in chunks of at most ``chunk_episodes`` (or only validate them, ``ds`` None: a
    dry run), one commit per chunk, leaving out and counting the ones the quality gate rejects when
    ``report.on_reject == "skip"``."""
    if report.on_reject not in ON_REJECT:
        raise ArgumentError(f"import: on_reject={report.on_reject!r}; use one of {ON_REJECT}")
    from ..write.bulk import check

    stored = 0  # episodes committed so far, quarantined included
    for chunk in _chunks(episodes, chunk_episodes):
        rest = list(chunk)
        while rest:
            try:
                if ds is None:
                    check(schema, rest)
                else:
                    ds.append_episodes(rest)
                    ds.flush()
            except QualityError as exc:
                if report.on_reject == "raise":
                    raise
                done = 0
                if ds is not None:
                    ds.flush()
                    done = len(ds) + len(ds.quality.quarantine()) - stored  # committed before the rejection
                    _count(report, rest[:done])
                    stored += done
                report.skip(f"rejected: {exc.check}")
                # exc.episode counts from the first episode of the refused commit batch (not from the call's
                # first, as its message does), and that batch starts right after the ones committed
                rest = rest[done:]
                del rest[exc.episode]
                continue
            _count(report, rest)
            stored += len(rest)
            rest = []


def _count(report: ImportReport, episodes: list[Mapping[str, Any]]) -> None:
    report.episodes += len(episodes)
    report.steps += sum(_steps(e) for e in episodes)


def finish(report: ImportReport, info: Mapping[str, Any], ds: Dataset | None, started: float) -> None:
    """Fill in what is known once the episodes are written: the importer's skips, quarantine, bytes out, time."""
    source = info.get("source", {}) if isinstance(info, Mapping) else {}
    skipped_episodes = source.get("skipped_episodes") or []
    if skipped_episodes:
        report.skip("source episodes with no transition to keep", len(skipped_episodes))
    for why, n in (source.get("skipped") or {}).items():
        if n:
            report.skip(str(why), int(n))
    if ds is not None:
        report.quarantined = len(ds.quality.quarantine())
        try:
            report.bytes_out = int(ds.location.fs.du(ds.location.path, total=True))
        except (OSError, NotImplementedError, ValueError):  # pragma: no cover - a store without sizes
            report.bytes_out = None
    report.seconds = time.perf_counter() - started
