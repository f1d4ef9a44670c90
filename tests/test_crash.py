"""Crash safety: writer processes SIGKILLed at random and chosen points lose nothing committed.

A fork server (tests/workers/writer.py) runs each trial in a fresh child that
opens the dataset, writes episodes derived from (seed, index) and dies: by
its own hand at a chosen point (mid-episode, mid-tensor-write, before, during
or after the table commit) or by the parent's SIGKILL after a random line of
its output. After every trial the parent reopens the dataset and checks,
against episodes it recomputes itself, that every episode reported committed
is present and identical, that every visible episode is whole, and that no
episode is visible twice; the next trial is the new writer that continues.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

import episodelake as el

from .test_vacuum_safety import age_files
from .workers.common import assert_all_match, assert_matches, crash_schema, episode, origins
from .workers.writer import parquet_files

ROOT = Path(__file__).resolve().parents[1]
CRASHES = ("none", "step", "tensor", "before-commit", "parquet", "after-commit")


class ForkServer:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.workers.writer", "serve"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def run(self, cmd: dict, kill_after: int | None) -> tuple[list[int], list[str]]:
        """Run one trial; returns (committed indices, output lines).

        The child pauses after each ``episode``/``committed`` line and at its ``point NAME`` kill
        point. The parent SIGKILLs it at the ``kill_after``-th such line (1-based) or at any kill
        point, and lets it go on (SIGUSR1) otherwise, so where a child dies never depends on timing.
        """
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        committed: list[int] = []
        lines: list[str] = []
        child = None
        pauses = 0
        while True:
            line = self.proc.stdout.readline()
            assert line, "the fork server died"
            word, _, rest = line.strip().partition(" ")
            if word == "exit":
                return committed, lines
            lines.append(line.strip())
            if word == "pid":
                child = int(rest)
                continue
            if word == "committed":
                committed += [int(i) for i in rest.split()]
            if word in ("episode", "committed", "point"):
                pauses += 1
                kill = word == "point" or pauses == kill_after
                os.kill(child, signal.SIGKILL if kill else signal.SIGUSR1)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def check_dataset(path: str, committed: set, attempted: set, checked: set) -> el.Dataset:
    """The dataset opens; committed episodes all there, nothing partial, foreign or duplicated."""
    ds = el.Dataset.open(path)
    seen = origins(ds)
    dup = [o for o, n in Counter(seen).items() if n > 1]
    assert not dup, f"episodes visible twice: {dup}"
    assert committed <= set(seen), f"lost committed episodes: {sorted(committed - set(seen))}"
    assert set(seen) <= attempted
    assert_all_match(ds, [episode(*o) for o in seen])
    for pos, origin in enumerate(seen):  # the public read path too, for episodes not checked before
        if origin not in checked:
            assert_matches(ds, pos, episode(*origin))
            checked.add(origin)
    assert len(set(ds.episode_ids.tolist())) == len(ds)
    return ds


def run_trials(path: str, trials: int, seed: int) -> Counter:
    el.Dataset.create(crash_schema(), path, partition_by=["task"])
    rng = np.random.default_rng(seed)
    committed: set[tuple[int, int]] = set()
    attempted: set[tuple[int, int]] = set()
    checked: set[tuple[int, int]] = set()
    figures = Counter()
    server = ForkServer()
    try:
        for t in range(trials):
            crash = CRASHES[t % len(CRASHES)]
            n = int(rng.integers(1, 5))
            per_commit = int(rng.integers(1, 3))
            commits = -(-n // per_commit)
            steps = sum(episode(t, i).length for i in range(n))
            cmd = {
                "path": path,
                "seed": t,
                "episodes": n,
                "per_commit": per_commit,
                "stepwise": crash == "step" or bool(rng.integers(0, 2)),
                "crash": crash,
                "at": int(rng.integers(0, steps if crash == "step" else commits)),
            }
            # "none" trials: the parent kills at one of the child's n + commits pauses
            kill_after = int(rng.integers(1, 1 + n + commits)) if crash == "none" else None
            done, lines = server.run(cmd, kill_after)
            assert not any(line.startswith(("error", "done")) for line in lines), lines
            points = [line.split()[1] for line in lines if line.startswith("point ")]
            assert set(points) == (set() if crash == "none" else {crash}), (crash, lines)
            figures[f"killed at {crash}"] += 1
            attempted |= {(t, i) for i in range(n)}
            committed |= {(t, i) for i in done}
            ds = check_dataset(path, committed, attempted, checked)
            if t % 40 == 39:  # short-lived writers never reach the automatic compaction interval
                ds.maintenance.compact()
            figures["trials"] += 1
            figures["episodes_attempted"] += n
            figures["episodes_reported_committed"] += len(done)
        figures["episodes_visible"] = len(ds)
        figures["episodes_lost"] = len(committed - set(origins(ds)))
    finally:
        server.close()
    return figures


def unreferenced_parquet(path: str) -> set[str]:
    """Data files on disk that the latest table version does not reference (read with deltalake alone)."""
    from deltalake import DeltaTable

    live = {os.path.normpath(u.removeprefix("file://")) for u in DeltaTable(os.path.join(path, "episodes")).file_uris()}
    return {os.path.normpath(f) for f in parquet_files(path)} - live


def logged_parquet(path: str) -> set[str]:
    """Data files any commit of the log added (read from the log's JSON entries alone)."""
    added = set()
    for entry in glob.glob(os.path.join(path, "episodes", "_delta_log", "*.json")):
        with open(entry) as f:
            actions = [json.loads(line) for line in f if line.strip()]
        added |= {a["add"]["path"] for a in actions if "add" in a}
    return {os.path.normpath(os.path.join(path, "episodes", unquote(a))) for a in added}


def finish_and_vacuum(path: str) -> None:
    """After the crashes: a new writer continues; vacuum removes exactly the leftovers; everything validates."""
    ds = el.Dataset.open(path)
    before = origins(ds)
    raw = episode(10_000, 0)
    ds.append_episodes([raw.as_dict(unwrap_action=True)])
    ds.flush()
    orphans = unreferenced_parquet(path)
    # compactions (every 64 commits) removed files through the log: those go once their removal is past the
    # retention (time travel); the crashes' files no commit ever added go once past the 1 h floor
    removed_by_log = orphans & logged_parquet(path)
    leftovers = orphans - removed_by_log
    writers = set(ds.snapshot().index["writer"].tolist())
    kept = ds.maintenance.vacuum(dry_run=True, retention_hours=0)  # leftovers younger than the floor stay
    assert {os.path.normpath(f) for f in kept.table_files} == removed_by_log and kept.tensor_arrays == []
    age_files(path, hours=2)
    report = ds.maintenance.vacuum(retention_hours=1)  # the log's removals are minutes old: kept for time travel
    assert leftovers, "the parquet crashes left no uncommitted data file"
    assert {os.path.normpath(f) for f in report.table_files} == leftovers
    assert not any(os.path.exists(f) for f in leftovers)
    assert report.tensor_arrays, "writers killed before their first commit left arrays behind"
    for array in report.tensor_arrays:  # only arrays of writers no committed episode references
        assert not any(f"/tensors/{w}" in array for w in writers), array
        assert not os.path.exists(array)
    ds = el.Dataset.open(path)
    assert origins(ds) == [*before, (10_000, 0)]
    assert_all_match(ds, [episode(*o) for o in origins(ds)])
    ds.maintenance.validate().raise_if_failed()
    again = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert {os.path.normpath(f) for f in again.table_files} == removed_by_log
    assert (again.tensor_arrays, again.truncated) == ([], [])


@pytest.mark.slow
def test_sigkill_trials(tmp_path):
    path = str(tmp_path / "ds")
    figures = run_trials(path, trials=36, seed=0)
    assert figures["trials"] == 36 and figures["episodes_lost"] == 0
    assert {k: figures[f"killed at {k}"] for k in CRASHES} == {k: 6 for k in CRASHES}  # every point hit, every time
    finish_and_vacuum(path)


@pytest.mark.slow
def test_sigkill_trials_long(tmp_path):
    path = str(tmp_path / "ds")
    figures = run_trials(path, trials=200, seed=1)
    assert figures["episodes_lost"] == 0 and sum(figures[f"killed at {k}"] for k in CRASHES) == 200
    finish_and_vacuum(path)
