"""How often a snapshot reads its Delta table: one scan for everything positional, statistics per file.

The snapshot's Arrow dataset is wrapped (or put on a counting filesystem) only
to count calls and opened files; every value asserted comes from the raw
generated episodes (tests/reference.py).
"""

from __future__ import annotations

import os
import shutil

import fsspec
import numpy as np
import pyarrow.fs as pafs
import pytest

import episodelake as el
from episodelake.read.snapshot import Snapshot
from episodelake.storage import layout

from .conftest import build_robot_dataset, robot_schema
from .reference import random_episode
from .test_query import OpenCounter, assert_stats_equal


class CountingDataset:
    """A snapshot's real Arrow dataset that records the columns of every whole-table scan (``to_table``)."""

    def __init__(self, real) -> None:
        self.real = real
        self.scans: list[list[str]] = []

    def to_table(self, *args, **kwargs):
        self.scans.append(list(kwargs.get("columns") or []))
        return self.real.to_table(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
    """A dataset committed in 5 pieces over two ``task`` partitions (several table files each)."""
    path = str(tmp_path_factory.mktemp("reads") / "ds")
    raws = build_robot_dataset(path, seed=11, episodes=30, per_commit=6, max_length=15)
    return path, raws


def counted(path: str) -> tuple[el.Dataset, CountingDataset]:
    ds = el.Dataset.open(path)
    snap = ds.snapshot()
    counter = CountingDataset(snap.arrow_dataset())
    snap._dataset = counter  # instrumentation: the same table and files, scans counted
    return ds, counter


def test_one_table_scan_serves_where_the_index_meta_and_refs(partitioned):
    path, raws = partitioned
    ds, counter = counted(path)
    assert counter.scans == []  # opening reads no table file
    snap = ds.snapshot()
    np.testing.assert_array_equal(snap.lengths, [r.length for r in raws])
    assert [ds.episode(i).meta["task"] for i in range(len(raws))] == [r.meta["task"] for r in raws]
    assert len(set(snap.index["writer"])) == 1
    assert len(snap.index["ref/observation/camera"]) == len(snap.index["crc/observation/camera"]) == len(raws)
    view = ds.where("task = ? AND success", ["pick"])  # after the scan: over the index in memory
    want = [r for r in raws if r.meta["task"] == "pick" and r.meta["success"]]
    assert len(view) == len(want) > 0
    assert_stats_equal(view.stats(), want)  # statistics come from their own per-file reads
    assert len(counter.scans) == 1
    assert {"episode_id", "created_at", "writer", "length", "task", "success"} <= set(counter.scans[0])
    assert {"ref/observation/camera", "crc/observation/camera"} <= set(counter.scans[0])


def test_small_per_step_fields_load_lazily_once_each(partitioned):
    path, raws = partitioned
    ds, counter = counted(path)
    stream = ds.segment_stream(2, batch_size=4, prefetch=0, seed=0)
    batches = iter(stream)
    next(batches)
    table_fields = {f.key for f in ds.schema.step_fields if not f.in_tensor}
    assert len(counter.scans) == 1 + len(table_fields)
    assert {key for scan in counter.scans[1:] for key in scan if key != "episode_id"} == table_fields
    for _ in range(5):
        next(batches)
    ds.where("length > ?", [3])
    assert len(counter.scans) == 1 + len(table_fields)  # nothing is read twice
    np.testing.assert_array_equal(ds.episode(len(raws) - 1).read().data["observation/state"], raws[-1].obs["state"])


def counted_snapshot(ds: el.Dataset) -> tuple[OpenCounter, Snapshot]:
    """``ds``'s snapshot reading the same table files through a filesystem that records every open."""
    fs = OpenCounter(skip_instance_cache=True)
    fs.opened = []
    table = ds._store.table
    snap = ds.snapshot()
    snap._dataset = table.dt.to_pyarrow_dataset(
        filesystem=pafs.SubTreeFileSystem(table.loc.delta_uri(), pafs.PyFileSystem(pafs.FSSpecHandler(fs)))
    )
    return fs, snap


@pytest.mark.parametrize("cached", [False, True])
def test_stats_read_only_the_files_holding_the_collection(partitioned, monkeypatch, cached):
    path, raws = partitioned
    shutil.rmtree(os.path.join(path, *layout.CACHE), ignore_errors=True)  # other tests' entries
    if not cached:
        monkeypatch.setenv("EPISODELAKE_TABLE_CACHE", "0")
    ds = el.Dataset.open(path)
    fs, _ = counted_snapshot(ds)
    files = fsspec.filesystem("file").glob(f"{path}/episodes/**/*.parquet")
    pick_files = sorted(f for f in files if "task=pick" in f)
    assert 0 < len(pick_files) < len(files)
    pick = ds.where("task = 'pick'")
    pick.snapshot().scan()  # the one index scan opens every file
    fs.opened.clear()
    assert_stats_equal(pick.stats(), [r for r in raws if r.meta["task"] == "pick"])
    assert sorted(fs.opened) == pick_files
    fs.opened.clear()
    assert_stats_equal(
        pick.where("success").stats(), [r for r in raws if r.meta["task"] == "pick" and r.meta["success"]]
    )
    assert fs.opened == []  # statistics of a file are read once per snapshot
    assert_stats_equal(ds.stats(), raws)
    assert sorted(fs.opened) == sorted(set(files) - set(pick_files))
    if cached:  # a new snapshot maps the entries the first one wrote: it opens no table file for statistics
        again = el.Dataset.open(path)
        fs, _ = counted_snapshot(again)
        pick = again.where("task = 'pick'")
        pick.snapshot().scan()
        fs.opened.clear()
        assert_stats_equal(pick.stats(), [r for r in raws if r.meta["task"] == "pick"])
        assert_stats_equal(again.stats(), raws)
        assert fs.opened == []


def index_of(ds: el.Dataset) -> dict[str, np.ndarray]:
    snap = ds.snapshot()
    return {name: snap.index[name] for name in snap.index_columns()}


def assert_same_index(got: el.Dataset, want: el.Dataset) -> None:
    a, b = index_of(got), index_of(want)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_newer_snapshot_reads_only_the_files_added_since(tmp_path):
    path = str(tmp_path / "grow")
    raws = build_robot_dataset(path, seed=8, episodes=12, per_commit=6, max_length=10)
    ds = el.Dataset.open(path)
    first = ds.snapshot()
    for name in ("episode_id", "length", "task", "success", "ref/observation/camera", "crc/observation/camera"):
        first.index[name]  # decoded columns the next snapshot keeps (it decodes only the new episodes)
    assert len(ds.where("task = 'pick'")) > 0  # the first snapshot's one scan
    before = set(fsspec.filesystem("file").glob(f"{path}/episodes/**/*.parquet"))
    rng = np.random.default_rng(9)
    more = [random_episode(rng, int(rng.integers(2, 10))) for _ in range(5)]
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in more)
    ds.flush()
    added = sorted(set(fsspec.filesystem("file").glob(f"{path}/episodes/**/*.parquet")) - before)
    assert added
    fs, snap = counted_snapshot(ds)
    everything = raws + more
    view = ds.where("task = ? AND success", ["pick"])
    assert sorted(set(fs.opened)) == added  # the new snapshot read only the new files
    assert snap.scan().kept == len(raws)  # one writer appended: earlier positions stay
    assert len(view) == sum(r.meta["task"] == "pick" and r.meta["success"] for r in everything)
    assert [ds.episode(i).meta["task"] for i in range(len(everything))] == [r.meta["task"] for r in everything]
    assert_same_index(ds, el.Dataset.open(path))
    assert_stats_equal(ds.stats(), everything)
    ds.maintenance.compact()  # files removed: the next snapshot scans everything again
    assert ds.snapshot().scan().kept == 0
    assert_same_index(ds, el.Dataset.open(path))


def test_a_grown_snapshot_reorders_when_an_older_episode_commits_later(tmp_path):
    path = str(tmp_path / "interleave")
    el.Dataset.create(robot_schema(), path)
    rng = np.random.default_rng(2)
    early, late = random_episode(rng, 4), random_episode(rng, 6)
    slow = el.Dataset.open(path)
    slow.append_episodes([early.as_dict(unwrap_action=True)])  # finished first, committed last
    fast = el.Dataset.open(path)
    fast.append_episodes([late.as_dict(unwrap_action=True)])
    fast.flush()
    reader = el.Dataset.open(path)
    assert len(reader.where("true")) == 1
    slow.flush()
    reader.refresh()
    assert reader.where("length = ?", [4]).episode_ids.tolist() == [int(reader.episode_ids[0])]
    assert reader.snapshot().scan().kept == 0  # the new episode sorts first: positions were re-sorted
    assert_same_index(reader, el.Dataset.open(path))
    assert_stats_equal(reader.stats(), [early, late])
