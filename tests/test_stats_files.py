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

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.stats import StatsTable

from .conftest import robot_schema
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
    rng = np.random.default_rng(11)
    raws = [random_episode(rng, int(rng.integers(1, 12))) for _ in range(36)]
    check = el.Check("positive", '"return" > 0', on_fail="quarantine")
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path, partition_by=["task"], checks=[check])
    for lo in range(0, len(raws), 9):  # four commits over two partitions: several table files
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[lo : lo + 9])
        ds.flush()
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
