"""Dataset.open(path, read_only=True) writes nothing: not on open, not on reads, audits or dry runs.

Root ignores file permissions, so the tree is also compared file by file
(names, sizes, modification times, contents) before and after, on a
directory whose write bits are removed.
"""

from __future__ import annotations

import os
import stat

import pytest

import episodelake as el
from episodelake.cli import main

from .conftest import build_robot_dataset
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
    assert ds.validate().ok
    dry = ds.vacuum(dry_run=True, retention_hours=0)
    assert dry.table_files == [] and dry.tensor_arrays == [] and dry.truncated == []
    past = el.Dataset.open(path, version=1)
    assert len(past) == 3 and past.read_only
    past.episode(0).read()
    assert main(["validate", path]) == 0
    assert main(["vacuum", path, "--dry-run"]) == 0
    capsys.readouterr()
    for write in (lambda: ds.new_episode({}), lambda: ds.append_episodes([]), ds.compact, ds.vacuum):
        with pytest.raises(el.ReadOnlyError):
            write()
    ds.close()
    assert tree_digest(path) == before


def test_query_and_sampling_write_nothing(frozen):
    path, _ = frozen
    before = tree_digest(path)
    ds = el.Dataset.open(path, read_only=True)
    try:
        count = ds.sql("select count(*) as n from episodes")
    except ImportError:
        pytest.skip("query module not available")
    assert count is not None
    view = ds.where("task = 'pick'")
    assert len(view) <= len(ds)
    assert len(ds.segments(2)[0].reward) == 2
    assert tree_digest(path) == before
