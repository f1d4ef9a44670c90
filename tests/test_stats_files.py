"""stats() merges per-file totals for the table files a subset holds whole; the result equals NumPy over the values.

A :class:`StatsTable` reduces each table file's statistics once and merges
those totals for every file a subset holds all rows of (the whole dataset:
every file). These tests draw files, values and subsets at random, ask in
random orders (so totals reduced for one subset serve the next), and compare
with naive NumPy over the raw values; at the dataset level, quarantined
episodes (left out of a snapshot) stay out of the totals and a release adds
them back.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.stats import StatsTable, _fold

from .conftest import build_quarantining_dataset, robot_schema
from .reference import random_episode
from .test_query import assert_stats_equal
from .test_stats_scale import stat_rows, state_field


@st.composite
def tables(draw: st.DrawFn) -> tuple[np.ndarray, list[np.ndarray | None], list[np.ndarray]]:
    """(each row's file, each row's values or None, subsets of rows to ask for in order)."""
    files = draw(st.integers(1, 5))
    rows = draw(st.integers(1, 24))
    file = np.array(draw(st.lists(st.integers(0, files - 1), min_size=rows, max_size=rows)), dtype=np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = [None if rng.random() < 0.25 else rng.standard_normal((int(rng.integers(1, 6)), 5)) for _ in range(rows)]
    asks = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["all", "files", "rows"]))
        if kind == "all":
            asks.append(np.arange(rows))
        elif kind == "files":  # whole files, maybe with a few rows of other files
            chosen = draw(st.sets(st.integers(0, files - 1), min_size=1))
            extra = draw(st.sets(st.integers(0, rows - 1), max_size=3))
            asks.append(np.union1d(np.flatnonzero(np.isin(file, list(chosen))), list(extra)).astype(np.int64))
        else:
            asks.append(np.array(sorted(draw(st.sets(st.integers(0, rows - 1)))), dtype=np.int64))
    return file, values, asks


@settings(max_examples=50, deadline=None)
@given(tables())
def test_file_totals_merge_equals_numpy_over_the_values(drawn):
    file, values, asks = drawn
    f = state_field()
    table = StatsTable(file, int(file.max()) + 1)
    for j in np.unique(file):  # one fill per table file, its rows in any order of the scan
        rows = np.flatnonzero(file == j)
        table.fill(f, rows, stat_rows(f, [values[r] for r in rows], empty_as_null=True))
    for rows in asks:
        got = table.aggregate(f, rows)
        held = [values[r] for r in rows if values[r] is not None]
        if not held:
            assert got["count"] == 0 and np.isnan(got["mean"]).all()
            continue
        flat = np.concatenate(held)
        assert got["count"] == len(flat)
        for m, want in (("sum", flat.sum(0)), ("mean", flat.mean(0)), ("std", flat.std(0))):
            np.testing.assert_allclose(got[m], want, rtol=1e-12, atol=1e-12, err_msg=m)
        np.testing.assert_array_equal(got["min"], flat.min(0))  # min and max are exact, not rounded
        np.testing.assert_array_equal(got["max"], flat.max(0))


def test_whole_dataset_stats_leave_quarantined_episodes_out_of_file_totals(tmp_path):
    path = str(tmp_path / "ds")
    ds, raws = build_quarantining_dataset(path, seed=11, episodes=36, per_commit=9)  # four commits, two partitions
    shown = [r for r in raws if r.reward.astype(np.float64).sum() > 0]
    held = [r for r in raws if r.reward.astype(np.float64).sum() <= 0]
    assert shown and held
    fresh = el.Dataset.open(path)
    assert_stats_equal(fresh.stats(), shown)
    assert_stats_equal(fresh.where("task = 'pick'").stats(), [r for r in shown if r.meta["task"] == "pick"])
    assert_stats_equal(fresh.stats(), shown)  # again: the totals reduced for the partition serve the whole
    assert_stats_equal(fresh.quality.quarantine().stats(), held)
    ds.quality.release(fresh.quality.quarantine().episode_ids.tolist())
    assert_stats_equal(el.Dataset.open(path).stats(), raws)


def test_stats_of_a_snapshot_grown_past_a_delete_equal_numpy(tmp_path):
    """A delete rewrites a table file: the grown scan keeps the other files' rows, so its rows are no longer
    grouped by file, and each file's statistics must still land on that file's episodes."""
    rng = np.random.default_rng(5)
    raws = [random_episode(rng, int(rng.integers(1, 12))) for _ in range(30)]
    ds = el.Dataset.create(robot_schema(), str(tmp_path / "ds"), partition_by=["task"])
    for lo in range(0, len(raws), 6):
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[lo : lo + 6])
        ds.flush()
    ds.snapshot().scan()  # the scan the next snapshot grows from
    ds.delete([int(ds.episode_ids[3])])
    live = raws[:3] + raws[4:]
    file = ds.snapshot().scan().file
    assert (np.diff(file) < 0).any()  # the rewritten file's rows follow the kept ones: not grouped by file
    assert_stats_equal(ds.where("task = 'pick'").stats(), [r for r in live if r.meta["task"] == "pick"])
    assert_stats_equal(ds.where("success").stats(), [r for r in live if r.meta["success"]])
    assert_stats_equal(ds.stats(), live)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_fold_reduces_every_row_like_numpy(rows, channels, seed):
    """The halving reduction of aggregate(): odd lengths keep their last row; min/max exact, sums to rounding."""
    values = np.random.default_rng(seed).standard_normal((rows, channels)) * 1e3
    for ufunc in (np.minimum, np.maximum):
        np.testing.assert_array_equal(_fold(ufunc, values), ufunc.reduce(values, axis=0))
    np.testing.assert_allclose(_fold(np.add, values), [math.fsum(c) for c in values.T], rtol=1e-12, atol=1e-9)
