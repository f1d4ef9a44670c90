"""A capacity buffer's disk is bounded by its capacity, counted in commits (issue 39, item 5).

The writer runs in a subprocess for a fixed number of commits (no time in the rule: the automatic
vacuum keeps the last ``Capacity.keep_versions`` versions, whatever their age); the test then measures
every byte under the dataset's root and reads every live episode back against the NumPy episodes of
:mod:`tests.workers.replay_disk`, and the FIFO reference of which episodes remain. A reader pinned to
an older version reads its episodes exactly within the window, and outside it gets an episodelake
error, never other data.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import episodelake as el

from .workers.replay import Fifo
from .workers.replay_disk import STEP_BYTES, camera_episode, check_episode, length_of, schema

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
CONSTANT = 1_500_000  # bytes: the table files, the log since its checkpoint, array metadata, descriptor


def disk_bytes(root: Path) -> int:
    return sum(os.path.getsize(os.path.join(b, f)) for b, _, fs in os.walk(root) for f in fs)


assert_episode = check_episode


def test_a_buffer_written_for_a_fixed_number_of_commits_stays_within_twice_its_live_bytes(tmp_path):
    path, commits, steps = tmp_path / "buffer", 400, 600
    cmd = [sys.executable, "-m", "tests.workers.replay_disk", str(path), str(commits), str(steps)]
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    model = Fifo(steps=steps)
    for n in range(commits):
        model.commit([(n, length_of(n))])
    ds = el.Dataset.open(str(path), read_only=True)
    assert [int(e.meta["n"]) for e in ds.episodes()] == model.numbers
    live = sum(length_of(n) + 1 for n in model.numbers) * STEP_BYTES
    written = sum(length_of(n) + 1 for n in range(commits)) * STEP_BYTES
    used = disk_bytes(path)
    assert used <= 2 * live + CONSTANT, (used, live)
    print(f"disk {used} bytes, live {live}: {used / live:.2f}x")
    assert written > 2 * (2 * live + CONSTANT)  # without reclaiming, the bound would not hold
    for ref in ds.episodes():
        assert_episode(ref)
    assert ds.maintenance.validate().ok


def test_a_reader_pinned_to_an_older_version_reads_it_within_the_window_and_never_other_data(tmp_path):
    path = str(tmp_path / "buffer")
    keep = 16  # Capacity's default keep_versions (checked at the end)
    capacity = el.Capacity(steps=60, vacuum_every=1)  # a vacuum after every commit
    ds = el.Dataset.create(schema(), path, capacity=capacity, commit_episodes=10**6)
    n = 0
    for _ in range(12):
        ds.append_episodes([camera_episode(n)])
        ds.flush()
        n += 1
    pinned_version = ds.version
    pinned = el.Dataset.open(path, version=pinned_version)  # time travel: a reader pinned to that version
    seen = [int(e.meta["n"]) for e in pinned.episodes()]
    for _ in range(keep - 1):  # the pinned version stays among the last ``keep``
        ds.append_episodes([camera_episode(n)])
        ds.flush()
        n += 1
    assert not set(seen) <= {int(e.meta["n"]) for e in ds.episodes()}  # some of what it saw is evicted now
    for ref in pinned.episodes():
        assert_episode(ref)
    again = el.Dataset.open(path, version=pinned_version)
    assert [int(e.meta["n"]) for e in again.episodes()] == seen
    for ref in again.episodes():
        assert_episode(ref)
    late = el.Dataset.open(path, version=pinned_version)  # pinned now, read after the window moved on
    late_refs = list(late.episodes())
    for _ in range(80):  # past the window, and past a compaction's checkpoint: the log before it goes too
        ds.append_episodes([camera_episode(n)])
        ds.flush()
        n += 1
    failed = 0
    for ref in late_refs:
        try:
            assert_episode(ref)  # exactly its episode, or an episodelake error: never other data
        except el.EpisodeLakeError:
            failed += 1
    assert failed > 0  # evicted data outside the window were reclaimed
    with pytest.raises(el.ArgumentError, match="no longer kept"):
        el.Dataset.open(path, version=pinned_version)
    latest = el.Dataset.open(path, read_only=True)
    for ref in latest.episodes():
        assert_episode(ref)
    assert latest.maintenance.validate().ok
    assert capacity.keep_versions == keep


@pytest.mark.slow
def test_the_window_vacuum_races_writes_compactions_vacuums_and_a_reader_without_loss(tmp_path):
    """Processes: a writer (its automatic vacuum on every commit, a window of 2 versions), a compactor, a
    vacuum with a window of 1 version and a following reader, all at once; then the buffer equals the FIFO
    model, every episode reads back exactly, and the reader never read other data than its episode."""
    path, truth, iterations = str(tmp_path / "buffer"), str(tmp_path / "truth.txt"), 40
    capacity = el.Capacity(episodes=10, keep_versions=2, vacuum_every=1)
    el.Dataset.create(schema(), path, capacity=capacity)
    procs = {
        role: subprocess.Popen(
            [sys.executable, "-m", "tests.workers.replay_disk", role, path, truth, str(iterations)],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("evict", "compact", "vacuum", "read")
    }
    outcomes = {role: proc.communicate(timeout=600) for role, proc in procs.items()}
    for role, proc in procs.items():
        assert proc.returncode == 0, f"{role}: {outcomes[role][1][-3000:]}"
    exact = int(outcomes["read"][0].split()[1])  # "read N exact, M refused"
    assert exact > 0, outcomes["read"][0]
    print(outcomes["read"][0].strip())
    model = Fifo(episodes=10)
    with open(truth) as fh:
        for line in fh:
            model.commit([(int(n), length_of(int(n))) for n in line.split()])
    ds = el.Dataset.open(path, read_only=True)
    assert [int(e.meta["n"]) for e in ds.episodes()] == model.numbers
    for ref in ds.episodes():
        check_episode(ref)
    assert ds.maintenance.validate().ok
