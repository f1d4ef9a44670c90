"""Dataset.open(path, read_only=True) writes nothing: not on open, not on reads, audits or dry runs.

Root ignores file permissions, so the tree is also compared file by file
(names, sizes, modification times, contents) before and after, on a
directory whose write bits are removed.
"""

from __future__ import annotations

import hashlib
import os
import stat

import numpy as np
import pytest

import episodelake as el
from episodelake.cli.main import main

from .conftest import build_robot_dataset, robot_schema
from .reference import random_episode
from .test_bad_input import tree_digest


@pytest.fixture
def frozen(tmp_path):
    """A dataset with three versions, its write bits removed (restored afterwards for cleanup)."""
    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=5, episodes=6, per_commit=3, max_length=20)
    modes = {}
    for base, dirs, files in os.walk(path):
        for name in [*dirs, *files, "."]:
            full = os.path.normpath(os.path.join(base, name))
            modes[full] = os.stat(full).st_mode
            os.chmod(full, modes[full] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield path, raws
    for full, mode in modes.items():
        os.chmod(full, mode)


def test_read_only_open_and_reads_write_nothing(frozen, capsys):
    path, raws = frozen
    before = tree_digest(path)
    ds = el.Dataset.open(path, read_only=True, verify=True)
    assert len(ds) == 6 and ds.num_steps == sum(r.length for r in raws)
    by_id = {}
    for i in range(len(ds)):
        seg = ds.episode(i).read()
        by_id[ds.episode(i).episode_id] = seg
    want = sorted(r.obs["camera"].sum() for r in raws)
    assert sorted(int(s.all_obs.camera.sum()) for s in by_id.values()) == [int(w) for w in want]
    assert ds.history() and ds.refresh() is ds
    assert ds.maintenance.validate().ok
    dry = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert dry.table_files == [] and dry.tensor_arrays == [] and dry.truncated == []
    past = el.Dataset.open(path, version=1)
    assert len(past) == 3 and past.maintenance.read_only
    past.episode(0).read()
    assert main(["validate", path]) == 0
    assert main(["vacuum", path, "--dry-run"]) == 0
    capsys.readouterr()
    writes = (lambda: ds.new_episode({}), lambda: ds.append_episodes([]), ds.maintenance.compact, ds.maintenance.vacuum)
    for write in writes:
        with pytest.raises(el.ReadOnlyError):
            write()
    ds.close()
    assert tree_digest(path) == before


def query_and_sample(ds: el.Dataset, raws) -> None:
    """Every read path a training job uses, each checked against the reference episodes."""
    n_pick = sum(r.meta["task"] == "pick" for r in raws)
    assert ds.sql("SELECT count(*) FROM episodes").fetchall()[0][0] == len(raws)
    assert len(ds.where("task = 'pick'")) == n_pick
    assert len(ds.select_episodes("SELECT episode_id FROM episodes WHERE length > 3")) == sum(
        r.length > 3 for r in raws
    )
    stats = ds.stats(["reward"])
    np.testing.assert_allclose(stats["reward"]["mean"], np.concatenate([r.reward for r in raws]).mean(), rtol=1e-5)
    segments = ds.segments(2)
    assert len(segments) == sum(max(r.length - 1, 0) + (r.length < 2) for r in raws)
    assert segments[0].reward.shape == (2,)
    stream = ds.segment_stream(2, batch_size=4, seed=0)
    assert stream.sample().reward.shape == (4, 2)
    stream.close()
    assert ds.sample_transitions(8, seed=0).reward.shape == (8,)
    assert ds.maintenance.validate().ok and ds.maintenance.vacuum(dry_run=True, retention_hours=0).table_files == []


def test_query_and_sampling_write_nothing(frozen):
    path, raws = frozen
    before = tree_digest(path)
    ds = el.Dataset.open(path, read_only=True)
    query_and_sample(ds, raws)
    ds.close()
    assert tree_digest(path) == before


def object_digest(fs, root: str) -> dict[str, tuple[int, str, str]]:
    """Every object under ``root``: (size, last-modified, md5 of its bytes)."""
    out = {}
    for key, info in fs.find(root, detail=True).items():
        out[key] = (info["size"], str(info.get("LastModified")), hashlib.md5(fs.cat_file(key)).hexdigest())
    return out


def test_query_and_sampling_write_nothing_on_s3(s3_server, s3_url):
    import s3fs

    rng = np.random.default_rng(11)
    raws = [random_episode(rng, int(rng.integers(2, 12))) for _ in range(6)]
    opts = s3_server.storage_options
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=opts, partition_by=["task"])
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    fs = s3fs.S3FileSystem(**opts)
    root = s3_url.removeprefix("s3://")
    before = object_digest(fs, root)
    assert any("/tensors/" in k for k in before) and any(k.endswith(".parquet") for k in before)
    reader = el.Dataset.open(s3_url, storage_options=opts, read_only=True)
    query_and_sample(reader, raws)
    reader.close()
    fs.invalidate_cache()
    assert object_digest(fs, root) == before
