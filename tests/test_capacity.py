"""Capacity datasets (replay buffers): FIFO eviction in the commit that adds, checked against a NumPy model.

The reference is :class:`tests.workers.replay.Fifo`, a plain list that drops the
oldest episodes while over capacity. Every version the table ever had must equal
the model after the same commit (so no version shows an eviction without its
episodes, or is over capacity), data of live episodes must be intact, and
vacuum must keep the bytes under ``tensors/`` bounded by the capacity without
rewriting a live array.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .workers.replay import Fifo, check_episode, episode, live_numbers, schema

ROOT = Path(__file__).resolve().parents[1]
STEP_BYTES = 3 * 16 * 16  # the camera tensor field of workers.replay.schema()


def fill(ds: el.Dataset, model: Fifo, lengths: list[int], commits: list[int], first: int = 0) -> list[list[int]]:
    """Commit episodes ``first, first+1, ...`` of ``lengths`` in batches of ``commits``; the model after each."""
    states, n = [], first
    for size in commits:
        batch = [(n + i, lengths[(n + i - first) % len(lengths)]) for i in range(size)]
        ds.append_episodes(episode(k, length) for k, length in batch)
        ds.flush()
        model.commit(batch)
        states.append(model.numbers)
        n += size
    return states


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    commits=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    steps=st.one_of(st.none(), st.integers(1, 40)),
    episodes=st.one_of(st.none(), st.integers(1, 8)),
)
@pytest.mark.parametrize("where", ["memory", "disk"])
def test_live_episodes_follow_the_fifo_model(where, tmp_path, lengths, commits, steps, episodes):
    if steps is None and episodes is None:
        steps = 20
    path = None if where == "memory" else tempfile.mkdtemp(dir=tmp_path)
    ds = el.Dataset.create(schema(), path, capacity={"steps": steps, "episodes": episodes}, commit_episodes=10**6)
    model = Fifo(steps, episodes)
    states = fill(ds, model, lengths, commits)
    assert live_numbers(ds) == states[-1]
    for ref in ds.episodes():
        check_episode(ref)
    assert ds.maintenance.validate().ok


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_every_version_equals_the_model_after_its_commit(where, tmp_path, request):
    """Atomicity: each version is the model after one commit: never the eviction without the add, never over."""
    path = request.getfixturevalue("s3_url") if where == "s3" else str(tmp_path / "ds")
    options = request.getfixturevalue("s3_server").storage_options if where == "s3" else None
    ds = el.Dataset.create(schema(), path, storage_options=options, capacity=25, commit_episodes=10**6)
    model = Fifo(steps=25)
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 10, 40).tolist()
    commits = rng.integers(1, 5, 10).tolist()
    states = fill(ds, model, lengths, commits)
    versions = [h["version"] for h in sorted(ds.history(), key=lambda h: h["version"])][1:]
    assert len(versions) == len(commits)  # one commit per flush, eviction included
    for version, state in zip(versions, states, strict=True):
        old = el.Dataset.open(path, version=version, storage_options=options)
        assert live_numbers(old) == state
        assert old.num_steps <= 25
    for ref in ds.episodes():
        check_episode(ref)
    assert ds.maintenance.validate().ok
    report = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert report.tensor_arrays  # arrays whose episodes were all evicted went
    assert live_numbers(el.Dataset.open(path, storage_options=options)) == states[-1]
    assert el.Dataset.open(path, storage_options=options).maintenance.validate().ok


def test_capacity_persists_and_a_writer_process_enforces_it(tmp_path):
    """The descriptor holds the capacity: another process that opens the dataset by path evicts too."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, capacity={"episodes": 6, "retention_hours": 1})
    assert json.loads((tmp_path / "ds" / "episodelake.json").read_text())["capacity"]["episodes"] == 6
    model = Fifo(episodes=6)
    fill(ds, model, [3], [4])
    out = run_worker("write", path, "4", "10", "3")
    assert out.returncode == 0, out.stderr
    model.commit([(n, 3) for n in range(4, 14)])
    assert live_numbers(ds.refresh()) == model.numbers == list(range(8, 14))
    assert ds.maintenance.validate().ok


def run_worker(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "tests.workers.replay", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, **kw)


def spawn_worker(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "tests.workers.replay", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_reader_process_keeps_its_snapshot_while_a_writer_process_evicts_it(tmp_path):
    """A reader process pinned before the evictions reads every episode it saw, intact, until vacuum."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, capacity={"steps": 30, "retention_hours": 1, "vacuum_every": 2})
    model = Fifo(steps=30)
    fill(ds, model, [4, 2, 5], [3, 2])
    reader = spawn_worker("read", path)
    ready = reader.stdout.readline().split()
    assert ready[0] == "ready" and [int(n) for n in ready[1:]] == model.numbers
    writer = run_worker("write", path, "5", "30", "4")  # auto-vacuums every 2 commits (retention 1 h)
    assert writer.returncode == 0, writer.stderr
    latest = el.Dataset.open(path)
    assert not set(live_numbers(latest)) & {int(n) for n in ready[1:]}  # all the reader saw is evicted
    out, err = reader.communicate("go\n", timeout=300)
    assert reader.returncode == 0, err
    assert out.strip() == "ok"
    for n in range(5, 35):
        model.commit([(n, episode(n)["rewards"].shape[0])])
    assert live_numbers(latest) == model.numbers
    assert latest.maintenance.validate().ok


def tensor_files(root: Path) -> dict[str, int]:
    """Every chunk file under ``tensors/`` with its modification time (ns)."""
    out = {}
    for base, _, files in os.walk(root / "tensors"):
        for name in files:
            if name != "zarr.json":
                out[os.path.join(base, name)] = os.stat(os.path.join(base, name)).st_mtime_ns
    return out


def tensor_bytes(root: Path) -> int:
    return sum(os.path.getsize(os.path.join(b, f)) for b, _, fs in os.walk(root / "tensors") for f in fs)


@pytest.mark.slow
def test_vacuum_keeps_tensor_bytes_bounded_without_rewriting_live_arrays(tmp_path):
    capacity, per_commit, every, max_len = 60, 3, 4, 11
    path = tmp_path / "ds"
    ds = el.Dataset.create(
        schema(),
        str(path),
        capacity={"steps": capacity, "retention_hours": 0, "vacuum_every": every, "break_old_versions": True},
        commit_episodes=10**6,
    )
    model = Fifo(steps=capacity)
    # Rows of live arrays: the live episodes (T + 1 rows each, at most capacity + their count) plus the
    # evicted part of one partly live commit; between automatic vacuums, up to ``every`` more commits.
    live_rows = 2 * capacity + per_commit * (max_len + 1)
    metadata = 2048  # zarr.json and directory entries of one array, generously
    arrays = capacity + 1 + every  # at most one live array per live episode, plus the boundary and the unvacuumed
    bound = (live_rows + every * per_commit * (max_len + 1)) * STEP_BYTES + arrays * metadata
    written = 0
    for i in range(0, 300, per_commit):
        fill(ds, model, [length_of_n(n) for n in range(i, i + per_commit)], [per_commit], first=i)
        written += sum(length_of_n(n) + 1 for n in range(i, i + per_commit)) * STEP_BYTES
        assert tensor_bytes(path) <= bound
    assert written > 3 * bound  # without eviction and vacuum the bound would be exceeded
    before = tensor_files(path)
    report = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    after = tensor_files(path)
    assert set(after) <= set(before) and all(after[p] == before[p] for p in after)  # nothing live rewritten
    assert tensor_bytes(path) <= live_rows * STEP_BYTES + arrays * metadata
    assert report.unreferenced_rows <= per_commit * (max_len + 1)  # only the boundary commit's evicted rows
    assert live_numbers(ds) == model.numbers
    for ref in ds.episodes():
        check_episode(ref)
    assert ds.maintenance.validate().ok


def length_of_n(n: int) -> int:
    return episode(n)["rewards"].shape[0]


def test_episodes_that_never_fit_are_never_added(tmp_path):
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"), capacity=5, commit_episodes=10**6)
    model = Fifo(steps=5)
    fill(ds, model, [3, 9, 2, 2], [4])  # 9 steps never fit; 0 (3) is evicted by 2 and 3
    assert live_numbers(ds) == model.numbers == [2, 3]
    assert ds.maintenance.validate().ok


@pytest.mark.parametrize(
    ("capacity", "pattern"),
    [
        (0, r"capacity steps must be a positive int or None, got 0"),
        ({"episodes": -1}, r"capacity episodes must be a positive int"),
        ({"steps": 10, "size": 3}, r"capacity: unknown key\(s\) \['size'\]"),
        ({"retention_hours": 1}, r"capacity needs steps and/or episodes"),
        ({"steps": 10, "retention_hours": -1}, r"retention_hours must be a number >= 0"),
        ({"steps": 10, "vacuum_every": 0}, r"vacuum_every must be a positive int"),
        ("100", r"capacity must be an int \(steps\), a dict or el.Capacity, got str"),
        (True, r"capacity must be an int"),
    ],
)
def test_bad_capacity_is_rejected_before_anything_is_created(tmp_path, capacity, pattern):
    with pytest.raises(el.ArgumentError, match=pattern):
        el.Dataset.create(schema(), str(tmp_path / "ds"), capacity=capacity)
    assert not (tmp_path / "ds").exists()


def test_capacity_object_and_int_forms_agree(tmp_path):
    a = el.Dataset.create(schema(), str(tmp_path / "a"), capacity=el.Capacity(steps=12))
    b = el.Dataset.create(schema(), str(tmp_path / "b"), capacity=12)
    want = el.Capacity(steps=12).to_json()
    assert a.maintenance.descriptor["capacity"] == b.maintenance.descriptor["capacity"] == want
