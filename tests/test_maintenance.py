"""vacuum() removes crash leftovers and unreferenced table files, never anything a version references.

Leftovers come from real crashes: the fork-server writer of test_crash is
SIGKILLed before its first commit (a writer array nothing references),
before a later commit (rows past the last referenced row) and as its Parquet
file appears (an uncommitted table file, which vacuum must list and remove). Every check compares the episodes
against the ones recomputed from (seed, index).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import episodelake as el
from episodelake.cli.main import main

from .test_bad_input import tree_digest
from .test_crash import ForkServer, unreferenced_parquet
from .test_vacuum_safety import age_files
from .workers.common import assert_all_match, crash_schema, episode, one_commit_per_episode, origins


def crash(server: ForkServer, path: str, seed: int, kind: str, at: int, episodes: int = 4) -> None:
    cmd = {
        "path": path,
        "seed": seed,
        "episodes": episodes,
        "per_commit": 1,
        "stepwise": False,
        "crash": kind,
        "at": at,
    }
    _, lines = server.run(cmd, None)
    assert "done" not in lines and f"point {kind}" in lines


def check(path: str) -> el.Dataset:
    ds = el.Dataset.open(path)
    assert_all_match(ds, [episode(*o) for o in origins(ds)])
    assert ds.maintenance.validate().ok
    return ds


@pytest.mark.slow
def test_vacuum_removes_crash_leftovers_only(tmp_path, capsys):
    path = str(tmp_path / "ds")
    el.Dataset.create(crash_schema(), path, partition_by=["task"])
    server = ForkServer()
    try:
        server.run({"path": path, "seed": 0, "episodes": 2, "per_commit": 1, "stepwise": True, "crash": "none"}, None)
        crash(server, path, 1, "before-commit", at=0)  # an array no table row references
        crash(server, path, 2, "before-commit", at=2)  # two commits, then rows past the last reference
    finally:
        server.close()
    # What a writer killed between its Parquet file and its log entry leaves: a whole data file the log never
    # names (made here, not raced for: a kill's timing depends on how busy the machine is).
    live = sorted(DeltaTable(os.path.join(path, "episodes")).file_uris())[0].removeprefix("file://")
    shutil.copyfile(live, os.path.join(os.path.dirname(live), f"part-00000-{uuid.uuid4()}-c000.zstd.parquet"))
    orphans = unreferenced_parquet(path)
    assert len(orphans) == 1
    with open(os.path.join(path, "episodelake.json.0f0f.tmp"), "w") as fh:
        fh.write("{")  # a descriptor write interrupted before its rename
    ds = check(path)
    visible = origins(ds)
    assert {(0, 0), (0, 1), (2, 0), (2, 1)} <= set(visible)
    version = ds.version

    fresh = ds.maintenance.vacuum(dry_run=True, retention_hours=0)  # leftovers younger than the floor (1 h) stay
    assert (fresh.table_files, fresh.tensor_arrays, fresh.truncated, fresh.temp_files) == ([], [], [], [])
    age_files(path, hours=2)  # the leftovers are now past the floor

    before = tree_digest(path)
    dry = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert tree_digest(path) == before  # a dry run deletes nothing
    assert {os.path.normpath(f) for f in dry.table_files} == orphans  # exactly the killed commit's file
    assert len(dry.tensor_arrays) >= 1 and dry.temp_files
    assert dry.truncated == [] and dry.unreclaimed_rows > 0  # single arrays are counted, never cut
    # nothing is 7 days old
    assert ds.maintenance.vacuum().to_json() == {**ds.maintenance.vacuum(dry_run=True).to_json(), "dry_run": False}
    assert tree_digest(path) == before

    assert main(["vacuum", path, "--dry-run", "--retention-hours", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensor_arrays"] == dry.tensor_arrays

    done = ds.maintenance.vacuum(retention_hours=1)  # the shortest retention allowed without the override
    assert done.tensor_arrays == dry.tensor_arrays and done.truncated == dry.truncated
    assert done.table_files == dry.table_files and done.temp_files == dry.temp_files
    for array in done.tensor_arrays:
        assert not os.path.exists(array)
    assert not any(os.path.exists(f) for f in orphans) and unreferenced_parquet(path) == set()
    ds = check(path)
    assert origins(ds) == visible
    again = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert (again.tensor_arrays, again.truncated, again.table_files) == ([], [], [])
    past = el.Dataset.open(path, version=version)  # versions whose files survive stay readable
    assert_all_match(past, [episode(*o) for o in origins(past)])

    ds.append_episodes([episode(9, 0).as_dict(unwrap_action=True)])  # a new writer carries on
    ds.flush()
    assert origins(check(path)) == [*visible, (9, 0)]


def test_vacuum_after_compaction_keeps_the_latest_version(tmp_path):
    path = str(tmp_path / "ds")
    ds = one_commit_per_episode(path, 6)
    old = ds.version
    ds.maintenance.compact()
    kept = ds.maintenance.vacuum()  # default retention: the compacted-away files are fresh, they stay
    assert kept.table_files == []
    assert len(el.Dataset.open(path, version=old)) == 6
    gone = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert len(gone.table_files) >= 6 and gone.tensor_arrays == [] and gone.truncated == []
    assert not any(os.path.exists(f) for f in gone.table_files)
    # deltalake keeps listing the tombstones of files already deleted: a second vacuum must report nothing
    again = el.Dataset.open(path).maintenance.vacuum(dry_run=True, retention_hours=0)
    assert (again.table_files, again.tensor_arrays, again.truncated) == ([], [], [])
    ds = check(path)
    assert origins(ds) == [(0, i) for i in range(6)]
    np.testing.assert_array_equal(ds.episode(5).read().reward, episode(0, 5).reward)


def test_compacted_files_keep_the_commits_codec(tmp_path):
    """compact() rewrites table files with Snappy, the codec commits write, not optimize's zstd default."""
    path = str(tmp_path / "ds")
    ds = one_commit_per_episode(path, 4)
    ds.maintenance.compact()
    files = DeltaTable(os.path.join(path, "episodes")).file_uris()
    assert len(files) == 2  # one per partition
    codecs = set()
    for uri in files:
        meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
        codecs |= {
            meta.row_group(g).column(c).compression for g in range(meta.num_row_groups) for c in range(meta.num_columns)
        }
    assert codecs == {"SNAPPY"}
    assert origins(check(path)) == [(0, i) for i in range(4)]
