"""The narrow face of ``Dataset`` (issue 21): 38 public names, maintenance, columns, quality and edits in namespaces.

Each moved verb is checked against something computed without it: the files
on disk and deltalake's own file list for ``maintenance.vacuum``, the
descriptor file for ``maintenance.descriptor``, a fresh process's exit for
``flush(discard=True)``, pyarrow's own conversion for ``sql(...).fetchnumpy()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable

import episodelake as el

from .workers.replay import check_episode, episode, schema

ROOT = Path(__file__).resolve().parents[1]

FACE = {
    "create", "open", "from_episodes", "new_episode", "vector_writer", "append_episodes", "flush", "close",
    "schema", "version", "location", "refresh", "history", "changes", "info", "episode", "episodes",
    "episode_ids", "num_steps", "snapshot", "positions", "where", "select_episodes", "sql", "stats", "segments",
    "segment_stream", "sample_transitions", "trajectories", "to_numpy", "to_ray", "segments_to_ray", "copy_to",
    "delete", "maintenance", "columns", "quality", "edit",
}  # fmt: skip


def written(path: str | None, numbers: range, **options) -> el.Dataset:
    ds = el.Dataset.create(schema(), path, **options)
    ds.append_episodes(episode(n) for n in numbers)
    ds.flush()
    return ds


def test_dataset_has_exactly_the_38_public_names():
    names = {n for n in dir(el.Dataset) if not n.startswith("_")}
    assert len(FACE) == 38
    assert names == FACE, (sorted(names - FACE), sorted(FACE - names))


def test_maintenance_vacuum_dry_run_lists_the_files_no_version_keeps(tmp_path):
    path = str(tmp_path / "ds")
    ds = written(path, range(0, 3))
    for n in range(3, 6):  # one table file per commit, merged away by the compaction
        ds.append_episodes([episode(n)])
        ds.flush()
    ds.maintenance.compact()
    data = {str(f) for f in Path(path, "episodes").rglob("*.parquet") if "_delta_log" not in f.parts}
    live = {os.path.normpath(u.removeprefix("file://")) for u in DeltaTable(os.path.join(path, "episodes")).file_uris()}
    unreferenced = data - live
    assert len(unreferenced) >= 4  # the commits' small files the compaction replaced

    dry = ds.maintenance.vacuum(dry_run=True, retention_hours=0, break_old_versions=True)
    assert {os.path.normpath(f) for f in dry.table_files} == unreferenced
    assert all(os.path.exists(f) for f in unreferenced)  # a dry run deletes nothing
    done = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert sorted(done.table_files) == sorted(dry.table_files)
    assert not any(os.path.exists(f) for f in unreferenced)
    reopened = el.Dataset.open(path)
    assert sorted(int(e.meta["n"]) for e in reopened.episodes()) == list(range(6))
    for ref in reopened.episodes():
        check_episode(ref)
    report = reopened.maintenance.validate()
    assert report.ok and report.episodes == 6, report.problems


def test_maintenance_validate_sees_the_finished_episodes_and_finds_damage(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6)
    ds.append_episodes(episode(n) for n in range(4))  # pending: validate commits them first
    assert ds.maintenance.validate().episodes == 4
    table_file = next(f for f in Path(path, "episodes").rglob("*.parquet") if "_delta_log" not in f.parts)
    table_file.write_bytes(table_file.read_bytes()[:-16])  # truncated: the footer is gone
    report = el.Dataset.open(path).maintenance.validate(tensors=False)
    assert not report.ok and any(table_file.name in str(p) for p in report.problems), report.problems


def test_maintenance_descriptor_and_read_only(tmp_path):
    path = str(tmp_path / "ds")
    ds = written(path, range(2), partition_by=["kind"], info={"robot": "arm"})
    on_disk = json.loads(Path(path, "episodelake.json").read_text())
    assert ds.maintenance.descriptor == on_disk
    assert ds.maintenance.descriptor["partition_by"] == ["kind"] and ds.info == {"robot": "arm"}
    assert ds.maintenance.read_only is False
    for reader in (el.Dataset.open(path, read_only=True), el.Dataset.open(path, version=0)):
        assert reader.maintenance.read_only is True
        with pytest.raises(el.ReadOnlyError, match="read-only") as compact:
            reader.maintenance.compact()
        with pytest.raises(el.ReadOnlyError) as add:
            reader.columns.add(el.FieldSpec("p", (), "float32", role="meta"))
        with pytest.raises(el.ReadOnlyError) as delete:
            reader.delete(all=True)
        with pytest.raises(el.ReadOnlyError) as append:
            reader.append_episodes([episode(9)])
        # one check, one message, whatever the verb
        assert len({str(e.value) for e in (compact, add, delete, append)}) == 1
    assert len(el.Dataset.open(path)) == 2


def test_columns_add_and_update_write_what_sql_reads(tmp_path):
    ds = written(str(tmp_path / "ds"), range(4))
    before = ds.version
    assert ds.columns.add(el.FieldSpec("score", (), "float32", role="meta")) == before + 1
    ids = [int(i) for i in ds.episode_ids]
    assert ds.columns.update({"score": [0.5, 1.5]}, (i for i in ids[:2])) == before + 2  # any iterable of ids
    assert ds.columns.update({"score": [7.0]}, where="n = $n", params={"n": 3}) == before + 3
    want = {int(ds.episode(id=i).meta["n"]): v for i, v in zip(ids[:2], [0.5, 1.5], strict=True)} | {3: 7.0}
    got = ds.sql("SELECT n, score FROM episodes ORDER BY n").fetchnumpy()
    np.testing.assert_array_equal(got["n"], [0, 1, 2, 3])
    for n, score in zip(got["n"].tolist(), got["score"].tolist(), strict=True):
        assert score == want[n] if n in want else np.isnan(score)  # never set: NULL reads NaN, as sql_numpy gave
    assert len(want) == 3
    with pytest.raises(el.ArgumentError, match="not derived columns"):
        ds.columns.update({"reward": [0.0] * 4})
    commits = len(DeltaTable(os.path.join(ds.location.url, "episodes")).history())
    with pytest.raises(el.ArgumentError, match="episode_ids repeat"):
        ds.columns.update({"score": [1.0, 2.0]}, [ids[0], ids[0]])
    assert ds.columns.update({"score": []}, where="n > 99") == ds.version == before + 3  # no episode: no commit
    assert len(DeltaTable(os.path.join(ds.location.url, "episodes")).history()) == commits
    assert ds.sql("SELECT score FROM episodes WHERE n = 0").fetchnumpy()["score"].tolist() == [0.5]


def test_delete_all_removes_every_episode_in_one_commit(tmp_path):
    path = str(tmp_path / "ds")
    ds = written(path, range(5))
    version = ds.version
    assert ds.delete(all=True) == 5
    assert len(ds) == 0 and ds.version == version + 1
    newest = el.Dataset.open(path).history()[0]
    assert (newest["operation"], newest["episodes_removed"]) == ("CLEAR", 5)
    assert len(el.Dataset.open(path, version=version)) == 5  # older versions keep them
    assert ds.delete(all=True) == 0 and ds.version == version + 1  # nothing left: no commit
    with pytest.raises(el.ArgumentError, match="exactly one"):
        ds.delete()
    with pytest.raises(el.ArgumentError, match="exactly one"):
        ds.delete(where="true", all=True)


DISCARD = """
import sys
import episodelake as el
from tests.workers.replay import episode, schema

ds = el.Dataset.create(schema(), sys.argv[1], commit_episodes=10**6)
ds.append_episodes([episode(0), episode(1)])
ds.flush()
ds.append_episodes(episode(n) for n in range(2, 5))
print(ds.flush(discard=True), ds.flush(discard=True), flush=True)
"""


def test_flush_discard_drops_the_pending_episodes_and_nothing_commits_at_exit(tmp_path):
    path = str(tmp_path / "ds")
    assert el.Dataset.create(schema(), None).flush(discard=True) == 0  # no writer yet
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", DISCARD, path], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["3", "0"]  # the three finished ones; the second call finds none
    ds = el.Dataset.open(path)
    assert sorted(int(e.meta["n"]) for e in ds.episodes()) == [0, 1]
    assert [h["operation"] for h in ds.history()] == ["APPEND", "CREATE"]


def test_append_dry_run_validates_and_writes_nothing(tmp_path):
    path = str(tmp_path / "ds")
    ds = written(path, range(2))
    version = ds.version
    assert ds.append_episodes([episode(n) for n in range(2, 5)], dry_run=True) == 3
    bad = {**episode(9), "rewards": np.zeros(2, np.float32)}
    with pytest.raises(el.ValidationError, match="episode 1"):
        ds.append_episodes([episode(8), bad], dry_run=True)
    columns = {"observations": {"state": np.zeros((7, 4), np.float32), "camera": np.zeros((7, 3, 16, 16), np.uint8)},
               "actions": np.zeros(5, np.int64), "rewards": np.zeros(5, np.float32),
               "meta": {"n": [10, 11], "kind": ["a", "b"]}}  # fmt: skip
    assert ds.append_episodes(columns, lengths=[2, 3], dry_run=True) == 2
    reader = el.Dataset.open(path, read_only=True)
    assert reader.append_episodes([episode(7)], dry_run=True) == 1  # validating needs no writer
    assert ds.flush() is None and ds.version == version and len(el.Dataset.open(path)) == 2


def test_episode_by_position_or_id(tmp_path):
    ds = written(None, range(4))
    for i, eid in enumerate(ds.episode_ids):
        assert ds.episode(id=int(eid)).position == ds.episode(i).position
    view = ds.where("n >= 2")
    inside, outside = int(view.episode_ids[0]), int(ds.episode_ids[0])
    assert view.episode(id=inside).meta["n"] == 2
    with pytest.raises(KeyError, match="no episode with id"):
        view.episode(id=outside)
    for bad in ({}, {"i": 0, "id": inside}):
        with pytest.raises(el.ArgumentError, match="exactly one"):
            ds.episode(**bad)


def test_fetchnumpy_gives_uniform_lists_as_axes_like_the_removed_sql_numpy():
    ds = written(None, range(3))
    result = ds.sql('SELECT "observation/state" AS s, list_value(t, t + 1) AS pair FROM steps ORDER BY episode_id, t')
    got = result.fetchnumpy()
    table = result.to_arrow_table()  # pyarrow's own lists, converted here by NumPy
    np.testing.assert_array_equal(got["s"], np.array(table.column("s").to_pylist(), np.float32))
    assert got["s"].shape == (table.num_rows, 4) and got["pair"].shape == (table.num_rows, 2)
    uneven = el.Dataset.create(schema(), None)
    uneven.append_episodes([episode(0, length=2), episode(1, length=3)])
    ragged = uneven.sql("SELECT list(reward) AS r FROM steps GROUP BY episode_id").fetchnumpy()["r"]
    assert ragged.dtype == object and sorted(len(r) for r in ragged) == [2, 3]
    assert ds.where("n = 1").sql("SELECT count(*) AS c FROM episodes").fetchnumpy()["c"].tolist() == [1]
