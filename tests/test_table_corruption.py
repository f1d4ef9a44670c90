"""A missing or truncated episode-table file gives CorruptionError naming it, from every entry point.

docs/reliability.md promises ``CorruptionError`` naming the file for damaged
files. Each case damages one Parquet file of a dataset written in several
commits, reopens it in a fresh ``Dataset`` (no cached state) and calls one
entry point.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import episodelake as el

from .conftest import build_robot_dataset


def _fetch(rel) -> object:
    return rel.fetchall()


ENTRY_POINTS = {
    "sql": lambda ds: _fetch(ds.sql("SELECT count(*) FROM episodes")),
    "sql-steps": lambda ds: _fetch(ds.sql("SELECT sum(reward) FROM steps")),
    "sql to_arrow_table": lambda ds: ds.sql("SELECT episode_id, length FROM episodes").to_arrow_table(),
    "sql fetchnumpy": lambda ds: ds.sql("SELECT episode_id FROM episodes").fetchnumpy(),
    "where": lambda ds: ds.where("success"),
    "select_episodes": lambda ds: ds.select_episodes("SELECT episode_id FROM episodes"),
    "stats": lambda ds: ds.stats(),
    "episode read": lambda ds: ds.episode(0).read(),
    "len": lambda ds: len(ds),
    "segments": lambda ds: ds.segments(2)[0],
    "segment_stream": lambda ds: next(iter(ds.segment_stream(2, batch_size=4, prefetch=0))),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A dataset committed in 4 pieces over two partitions (several Parquet files per partition)."""
    path = tmp_path_factory.mktemp("table-corruption") / "ds"
    build_robot_dataset(str(path), seed=5, episodes=16, per_commit=4, max_length=12)
    return path


def _damage(pristine: Path, tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A copy of the dataset with one table file (a later commit's, so earlier files stay fine) damaged."""
    root = tmp_path / "ds"
    shutil.copytree(pristine, root)
    files = sorted((root / "episodes").glob("task=*/*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) >= 4
    victim = files[len(files) // 2]
    if how == "missing":
        victim.unlink()
    else:
        with open(victim, "r+b") as fh:
            fh.truncate(victim.stat().st_size // 2)
    return root, victim


@pytest.mark.parametrize("how", ["missing", "truncated"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_damaged_table_file_names_the_file(pristine, tmp_path, how, entry):
    root, victim = _damage(pristine, tmp_path, how)
    ds = el.Dataset.open(str(root), read_only=True)
    with pytest.raises(el.CorruptionError) as info:
        ENTRY_POINTS[entry](ds)
    assert victim.name in str(info.value)


def test_pristine_dataset_answers_every_entry_point(pristine, tmp_path):
    """The same calls succeed on the undamaged copy, so each failure above comes from the damage."""
    root = tmp_path / "ds"
    shutil.copytree(pristine, root)
    ds = el.Dataset.open(str(root), read_only=True)
    for name, call in ENTRY_POINTS.items():
        assert call(ds) is not None, name
    assert len(ds) == 16


def test_damage_after_the_first_query_is_caught_at_fetch(pristine, tmp_path):
    """The once-per-snapshot listing has passed; a file then cut short still gives CorruptionError when fetched."""
    root = tmp_path / "ds"
    shutil.copytree(pristine, root)
    ds = el.Dataset.open(str(root), read_only=True)
    assert ds.sql("SELECT count(*) AS n FROM episodes").fetchnumpy()["n"][0] == 16
    victim = sorted((root / "episodes").glob("task=*/*.parquet"))[0]
    os.truncate(victim, 100)
    for call in (ENTRY_POINTS["sql to_arrow_table"], ENTRY_POINTS["where"], ENTRY_POINTS["select_episodes"]):
        with pytest.raises(el.CorruptionError) as info:
            call(ds)
        assert victim.name in str(info.value)
    # a query error is still a QueryError, not corruption
    with pytest.raises(el.QueryError):
        ds.sql("SELECT nope FROM episodes").to_arrow_table()
