"""Concurrent writer processes on one local dataset, and readers opened while they write.

K real processes (tests/workers/writer.py) start together and append
episodes derived from (seed, index); the parent reads while they commit. Every
episode must end up present exactly once with a unique id and identical data;
every reader sees a consistent snapshot: for each writer a prefix of its
episodes (a writer commits in order), each whole. A reader stays on its
snapshot while others commit until ``refresh()`` moves it to the latest.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import episodelake as el

from .workers.common import assert_all_match, crash_schema, episode, one_commit_per_episode, origins

ROOT = Path(__file__).resolve().parents[1]


def spawn_writers(path: str, writers: int, episodes: int, per_commit: int) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "tests.workers.writer", "append", path]
    return [
        subprocess.Popen(
            [*cmd, str(seed), str(episodes), str(per_commit)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(writers)
    ]


def check_snapshot(ds: el.Dataset) -> None:
    """Consistent snapshot: per writer a prefix of its episodes, whole and identical; nothing twice."""
    seen = origins(ds)
    assert len(set(seen)) == len(seen)
    by_seed: dict[int, list[int]] = {}
    for seed, index in seen:
        by_seed.setdefault(seed, []).append(index)
    for seed, indices in by_seed.items():
        assert sorted(indices) == list(range(len(indices))), f"writer {seed} shows a non-prefix {indices}"
    assert_all_match(ds, [episode(*o) for o in seen])


def run_concurrent(path: str, writers: int, episodes: int, per_commit: int, check_every: int = 1) -> dict[str, int]:
    el.Dataset.create(crash_schema(), path, partition_by=["task"])
    early = el.Dataset.open(path, read_only=True)
    assert len(early) == 0
    procs = spawn_writers(path, writers, episodes, per_commit)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    reported: dict[int, list[int]] = {seed: [] for seed in range(writers)}
    sel = selectors.DefaultSelector()
    for seed, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, seed)
    reads = lines = 0
    pinned = None
    while sel.get_map():
        for key, _ in sel.select():
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                continue
            reported[key.data] += [int(i) for i in line.split()[1:]]
            lines += 1
            if lines % check_every:
                continue
            reader = el.Dataset.open(path, read_only=True)  # a reader opened mid-write
            check_snapshot(reader)
            # whatever this writer reported committed before the reader opened is visible
            assert {(key.data, i) for i in reported[key.data]} <= set(origins(reader))
            reads += 1
            if pinned is None:
                pinned = (reader, origins(reader))
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()
    reader, before = pinned
    assert origins(reader) == before  # its snapshot did not move while others committed
    assert len(early) == 0
    for ds in (early.refresh(), reader.refresh(), el.Dataset.open(path)):
        seen = origins(ds)
        assert Counter(seen) == Counter((s, i) for s in range(writers) for i in range(episodes))
        assert len(set(ds.episode_ids.tolist())) == writers * episodes
    check_snapshot(early)
    el.Dataset.open(path).maintenance.validate().raise_if_failed()
    return {"writers": writers, "episodes": writers * episodes, "commits": len(early.history()) - 1, "reads": reads}


@pytest.mark.slow
def test_concurrent_appends(tmp_path):
    figures = run_concurrent(str(tmp_path / "ds"), writers=4, episodes=12, per_commit=2)
    print("concurrency:", figures)
    assert figures["commits"] >= 4 * 6


@pytest.mark.slow
def test_concurrent_appends_many_commits(tmp_path):
    # each writer passes the automatic compaction interval (64 commits): compaction races appends
    figures = run_concurrent(str(tmp_path / "ds"), writers=4, episodes=66, per_commit=1, check_every=16)
    print("concurrency (slow):", figures)
    operations = [h.get("operation") for h in el.Dataset.open(str(tmp_path / "ds")).history()]
    assert "COMPACT" in operations  # each writer compacted once, racing the others' appends


def test_compaction_from_a_stale_handle_duplicates_nothing(tmp_path):
    """deltalake would let a second compaction of already-compacted files commit, duplicating their rows."""
    path = str(tmp_path / "ds")
    ds = one_commit_per_episode(path, 5)
    stale = el.Dataset.open(path)
    ds.maintenance.compact()
    stale.maintenance.compact()
    for handle in (stale, el.Dataset.open(path)):
        assert origins(handle) == [(0, i) for i in range(5)]
    assert not os.path.exists(os.path.join(path, "episodes", "_episodelake_compact.lock"))
