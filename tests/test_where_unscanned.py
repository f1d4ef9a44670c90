"""A Dataset's first where(), before the snapshot's index scan: the same episodes as after it, and as NumPy says.

Before the scan, where() runs over the table files and places the matches by
their order keys (created_at, episode_id); bulk commits give every episode of
a batch one created_at, so the ids' tie-break is exercised too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import episodelake as el

from .conftest import build_robot_dataset
from .test_query import assert_stats_equal

REPO = Path(__file__).resolve().parents[1]

PREDICATES = [
    ("task = 'pick' AND success", lambda r: r.meta["task"] == "pick" and r.meta["success"]),
    ("length > 7", lambda r: r.length > 7),
    ("success OR length < 4", lambda r: r.meta["success"] or r.length < 4),
    ("length > 10000", lambda r: False),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("unscanned") / "ds")
    return path, build_robot_dataset(path, seed=5, episodes=40, per_commit=7, max_length=15)


@pytest.mark.parametrize("predicate, keep", PREDICATES)
def test_first_where_matches_reference_and_scanned_where(built, predicate, keep):
    path, raws = built
    want = [i for i, r in enumerate(raws) if keep(r)]
    fresh = el.Dataset.open(path)
    first = fresh.where(predicate)
    assert fresh.snapshot()._scan is None  # answered without the index scan
    np.testing.assert_array_equal(first.positions, want)
    scanned = el.Dataset.open(path)
    scanned.snapshot().scan()
    np.testing.assert_array_equal(scanned.where(predicate).positions, want)
    np.testing.assert_array_equal(fresh.snapshot().order_keys()[1], scanned.snapshot().index["episode_id"])
    again = fresh.where(predicate)  # a dataset queried again is worth its index: the second where() makes it
    assert fresh.snapshot()._scan is not None
    np.testing.assert_array_equal(again.positions, want)


def test_view_of_a_first_where_reads_like_any_view(built):
    path, raws = built
    view = el.Dataset.open(path).where("task = ? AND success", ["pick"])
    chosen = [r for r in raws if r.meta["task"] == "pick" and r.meta["success"]]
    assert view.sql("SELECT count(*) FROM episodes").fetchall() == [(len(chosen),)]
    assert_stats_equal(view.stats(), chosen)
    longer = [r for r in chosen if r.length > 5]
    assert len(view.where("length > 5")) == len(longer)


def test_first_where_with_params_and_errors(built):
    path, raws = built
    ds = el.Dataset.open(path)
    got = ds.where("length >= ?", [5]).positions
    np.testing.assert_array_equal(got, [i for i, r in enumerate(raws) if r.length >= 5])
    with pytest.raises(el.QueryError):
        el.Dataset.open(path).where("no_such_column > 1")


def test_first_where_on_a_columnar_import(tmp_path):
    """One commit, one created_at for all: the order is by id alone."""
    n, T = 300, 3
    rng = np.random.default_rng(0)
    cols = {
        "observations": rng.standard_normal((n * (T + 1), 4)).astype(np.float32),
        "actions": rng.standard_normal((n * T, 2)).astype(np.float32),
        "rewards": rng.standard_normal(n * T).astype(np.float32),
        "terminated": np.ones(n, bool),
    }
    el.Dataset.from_episodes(cols, str(tmp_path / "cols"), lengths=np.full(n, T))
    returns = cols["rewards"].reshape(n, T).sum(axis=1)
    ds = el.Dataset.open(str(tmp_path / "cols"))
    got = ds.where("return > 0").positions
    np.testing.assert_array_equal(got, np.flatnonzero(returns > 0))


WHERE_ONLY = """
import sys
import episodelake as el
from episodelake.read import query
view = el.Dataset.open(sys.argv[1]).where("task = 'pick' AND success")
print(len(view), sorted(query._DBS))
view.sql("SELECT count(*) FROM episodes").fetchall()
print(sorted(query._DBS))
"""


def test_a_processs_first_where_opens_only_the_sandboxed_database(built):
    """where() runs sandboxed, so a fresh process opens that database alone; a plain sql() then opens the other."""
    path, raws = built
    out = subprocess.run([sys.executable, "-c", WHERE_ONLY, path], capture_output=True, text=True, check=True, cwd=REPO)
    want = sum(r.meta["task"] == "pick" and bool(r.meta["success"]) for r in raws)
    assert out.stdout.split("\n")[:2] == [f"{want} [True]", "[False, True]"]
