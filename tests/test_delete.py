"""Deleting episodes: ``Dataset.delete``/``clear`` and ``episodelake delete``.

Each is one Delta commit; ``validate()`` stays green; older versions (time
travel, a snapshot held in this process or in another process) keep reading
the deleted episodes, intact, until ``vacuum`` removes their files; bad input
changes nothing. Expected survivors are computed from the episode numbers the
test wrote (tests/workers/replay.py), never from the library.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

import episodelake as el
from episodelake.cli.main import main

from .test_bad_input import tree_digest
from .workers.replay import check_episode, episode, length_of, live_numbers, schema

ROOT = Path(__file__).resolve().parents[1]


def make(path: str | None, count: int = 12, per_commit: int = 4, **options) -> el.Dataset:
    ds = el.Dataset.create(schema(), path, partition_by=["kind"], commit_episodes=10**6, **options)
    for i in range(0, count, per_commit):
        ds.append_episodes(episode(n) for n in range(i, min(count, i + per_commit)))
        ds.flush()
    return ds


def ids_of(ds: el.Dataset, numbers: list[int]) -> list[int]:
    by_n = {int(e.meta["n"]): e.episode_id for e in ds.episodes()}
    return [by_n[n] for n in numbers]


@pytest.mark.parametrize("where", ["memory", "disk", "s3"])
def test_delete_by_ids_and_by_predicate_one_commit_each(where, tmp_path, request):
    path = request.getfixturevalue("s3_url") if where == "s3" else {"memory": None, "disk": str(tmp_path / "ds")}[where]
    options = request.getfixturevalue("s3_server").storage_options if where == "s3" else None
    ds = make(path, storage_options=options)
    v0 = ds.version
    assert ds.delete(ids_of(ds, [1, 4, 7])) == 3
    assert ds.version == v0 + 1
    assert live_numbers(ds) == [n for n in range(12) if n not in (1, 4, 7)]
    assert ds.delete(where="n >= ? AND kind = 'even'", params=[6]) == 3  # 6, 8, 10
    assert ds.version == v0 + 2
    want = [0, 2, 3, 5, 9, 11]
    assert live_numbers(ds) == want
    assert ds.delete(where="n > 100") == 0 and ds.version == v0 + 2  # nothing matched: no commit
    for ref in ds.episodes():
        check_episode(ref)
    assert ds.maintenance.validate().ok
    if path is not None:
        reopened = el.Dataset.open(path, storage_options=options)
        assert live_numbers(reopened) == want
        assert reopened.maintenance.validate().ok
        assert live_numbers(el.Dataset.open(path, version=v0, storage_options=options)) == list(range(12))
    assert ds.delete(all=True) == 6 and len(ds) == 0 and ds.version == v0 + 3
    assert ds.delete(all=True) == 0 and ds.version == v0 + 3
    assert ds.maintenance.validate().ok
    ds.append_episodes([episode(50)])  # a cleared dataset takes new episodes
    assert live_numbers(ds) == [50]


def test_old_snapshots_and_time_travel_read_deleted_episodes_until_vacuum(tmp_path):
    path = str(tmp_path / "ds")
    ds = make(path)
    before = ds.version
    view = ds.where("n < 6")  # pinned to this version's snapshot
    stream = ds.segment_stream(2, batch_size=4, seed=0, prefetch=0)
    ds.delete(where="n < 6")
    assert live_numbers(ds) == list(range(6, 12))
    assert live_numbers(view) == list(range(6))
    for ref in view.episodes():  # this process: the old snapshot's rows, intact
        check_episode(ref)
    batch = next(iter(stream))  # a stream built before the delete samples its own snapshot
    assert set(batch.meta["n"].tolist()) <= set(range(12))
    old = el.Dataset.open(path, version=before)
    assert live_numbers(old) == list(range(12))
    for ref in old.episodes():
        check_episode(ref)
    assert old.maintenance.validate().ok
    ds.maintenance.vacuum()  # default retention (7 days): nothing of the old version goes
    assert live_numbers(el.Dataset.open(path, version=before)) == list(range(12))
    with pytest.raises(el.ArgumentError, match="break_old_versions"):
        ds.maintenance.vacuum(retention_hours=0)  # it would break the old version: refused without the override
    assert live_numbers(el.Dataset.open(path, version=before)) == list(range(12))
    report = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert report.table_files  # the files only the old versions referenced
    with pytest.raises(el.CorruptionError):
        live_numbers(el.Dataset.open(path, version=before))
    assert live_numbers(el.Dataset.open(path)) == list(range(6, 12))
    assert ds.maintenance.validate().ok


def test_a_reader_process_on_an_older_snapshot_keeps_reading(tmp_path):
    path = str(tmp_path / "ds")
    ds = make(path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    reader = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.replay", "read", path],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = reader.stdout.readline().split()
    assert ready == ["ready", *map(str, range(12))]
    assert ds.delete(all=True) == 12
    out, err = reader.communicate("go\n", timeout=300)
    assert reader.returncode == 0, err
    assert out.strip() == "ok"
    assert len(el.Dataset.open(path)) == 0


def test_capacity_dataset_delete_then_evict(tmp_path):
    """Deletes and evictions mix: the evictor rereads the table after a delete."""
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"), capacity={"episodes": 5}, commit_episodes=10**6)
    ds.append_episodes(episode(n) for n in range(5))
    ds.flush()
    ds.delete(ids_of(ds, [1, 2]))
    ds.append_episodes(episode(n) for n in range(5, 8))
    ds.flush()
    assert live_numbers(ds) == [3, 4, 5, 6, 7]
    assert ds.maintenance.validate().ok


def test_delete_through_deltalake_directly_still_validates(tmp_path):
    """deltalake's own delete rewrites files with view/large types: validate reads them as equal."""
    path = str(tmp_path / "ds")
    ds = make(path)
    n = DeltaTable(str(tmp_path / "ds" / "episodes")).delete("n < 3")["num_deleted_rows"]
    assert n == 3
    ds.refresh()
    assert live_numbers(ds) == list(range(3, 12))
    report = ds.maintenance.validate()
    assert report.ok, report.problems
    for ref in ds.episodes():
        check_episode(ref)


def test_cli_delete(tmp_path, capsys):
    path = str(tmp_path / "ds")
    make(path)
    assert main(["delete", path, "--where", "n % 3 = 0", "--json"]) == 0
    assert capsys.readouterr().out.strip().startswith('{"deleted": 4')
    assert live_numbers(el.Dataset.open(path)) == [n for n in range(12) if n % 3]
    assert main(["delete", path, "--where", "nope = 1"]) == 1
    assert "nope" in capsys.readouterr().err
    assert main(["delete", path]) == 2  # neither --where nor --all
    assert main(["delete", path, "--all"]) == 0
    assert "deleted 8 episodes" in capsys.readouterr().out
    assert len(el.Dataset.open(path)) == 0
    assert el.Dataset.open(path).maintenance.validate().ok


@pytest.mark.parametrize(
    ("call", "exc", "pattern"),
    [
        (lambda ds: ds.delete([123]), el.ArgumentError, r"1 episode id\(s\) not in version \d+: \[123\]"),
        (lambda ds: ds.delete([ds.episode_ids[0], -5]), el.ArgumentError, r"not in version \d+: \[-5\]"),
        (lambda ds: ds.delete(["x"]), el.ArgumentError, r"episode_ids\[0\] must be an int, got 'x'"),
        (lambda ds: ds.delete(7), el.ArgumentError, r"episode_ids must be a sequence of ints, got int"),
        (lambda ds: ds.delete(where="nope = 1"), el.QueryError, r"nope"),
        (lambda ds: ds.delete(where="n = ?"), el.QueryError, r"SQL error"),
        (lambda ds: ds.delete(), el.ArgumentError, r"exactly one of them"),
        (lambda ds: ds.delete([1], where="n = 1"), el.ArgumentError, r"exactly one of them"),
        (lambda ds: ds.delete([1], params=[1]), el.ArgumentError, r"params= fills placeholders of where="),
        (lambda ds: el.Dataset.open(ds.location.url, read_only=True).delete(where="1=1"), el.ReadOnlyError, "read-"),
        (lambda ds: el.Dataset.open(ds.location.url, version=1).delete(all=True), el.ReadOnlyError, r"read-only"),
    ],
)  # fmt: skip
def test_bad_delete_changes_nothing(tmp_path, call, exc, pattern):
    path = str(tmp_path / "ds")
    ds = make(path)
    before = tree_digest(path)
    with pytest.raises(exc, match=pattern):
        call(ds)
    assert tree_digest(path) == before
    assert live_numbers(el.Dataset.open(path)) == list(range(12))


def test_vacuum_of_a_local_dataset_without_capacity_counts_deleted_rows(tmp_path):
    """One array per writer and field, never cut (its writer may grow it): deleted rows are counted."""
    ds = make(str(tmp_path / "ds"), count=6, per_commit=6)
    ds.delete(ids_of(ds, [2, 5]))
    report = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    rows = {n: length_of(n) + 1 for n in range(6)}  # camera rows: T + 1 per episode
    assert report.truncated == []
    assert report.unreclaimed_rows == rows[2] + rows[5]
    for ref in ds.episodes():
        check_episode(ref)
    assert ds.maintenance.validate().ok
