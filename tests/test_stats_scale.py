"""stats() of any subset equals NumPy over the raw values: new datasets, datasets written by 0.1.0, both mixed.

Statistics are read per table file into a per-snapshot table and aggregated by
a NumPy gather over the subset's rows; these tests draw subsets at random and
compare against naive NumPy over the generated episodes (tests/reference.py).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.stats import STAT_PARTS, StatsTable, stat_column

from .conftest import build_robot_dataset, robot_schema
from .reference import random_episode
from .test_query import assert_stats_equal, reference_stats

REPO = Path(__file__).resolve().parents[1]
OLD_RELEASE = "cbeaee775c86628879c6e64ca72f8358a2c463d1"  # the last commit of episodelake 0.1.0's layout
EPISODES = 40

# 0.1.0 itself (from git) writing reference episodes in 4 commits over two partitions.
OLD_WRITER = """
import sys
import numpy as np
import episodelake as el
from tests.conftest import robot_schema
from tests.reference import random_episode

assert el.__file__.startswith(sys.argv[2]), el.__file__
rng = np.random.default_rng(int(sys.argv[3]))
raws = [random_episode(rng, int(rng.integers(1, 20))) for _ in range(int(sys.argv[4]))]
ds = el.Dataset.create(robot_schema(), sys.argv[1], partition_by=["task"])
for i in range(0, len(raws), 10):
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[i : i + 10])
    ds.flush()
"""


def check_subset(ds: el.Dataset, raws: list, keep: list[bool], fields: list[str] | None) -> None:
    """stats() of the episodes picked by ``keep`` (selected with a bound id list) against NumPy."""
    ids = [int(i) for i, k in zip(ds.episode_ids, keep, strict=True) if k]
    view = ds.where("list_contains(?, episode_id)", [ids])
    subset = [r for r, k in zip(raws, keep, strict=True) if k]
    assert view.episode_ids.tolist() == ids
    got = view.stats(fields)
    if fields is None:
        if subset:
            assert_stats_equal(got, subset)
        else:
            assert got["episodes"]["count"] == 0 and np.isnan(got["reward"]["mean"])
        return
    assert set(got) == {"episodes", "length", "return", *fields}
    if subset:
        want = reference_stats(subset)
        for key in fields:
            for m in ("count", "sum", "mean", "std", "min", "max"):
                np.testing.assert_allclose(got[key][m], np.squeeze(want[key][m]), rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def new_dataset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("stats-scale") / "ds")
    raws = build_robot_dataset(path, seed=21, episodes=EPISODES, per_commit=7, max_length=20)
    return path, raws


FIELDS = st.one_of(
    st.none(), st.lists(st.sampled_from(["observation/state", "observation/camera", "action", "reward"]), unique=True)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keep=st.lists(st.booleans(), min_size=EPISODES, max_size=EPISODES), fields=FIELDS, fresh=st.booleans())
def test_stats_of_random_subsets_match_numpy(new_dataset, keep, fields, fresh):
    path, raws = new_dataset
    # a fresh snapshot reads statistics file by file as subsets need them; a kept one reuses what it read
    ds = el.Dataset.open(path) if fresh else _kept(path)
    check_subset(ds, raws, keep, fields)


_OPEN: dict[str, el.Dataset] = {}


def _kept(path: str) -> el.Dataset:
    return _OPEN.setdefault(path, el.Dataset.open(path))


@pytest.fixture
def old_release(tmp_path):
    """episodelake 0.1.0's source tree, extracted from git."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", OLD_RELEASE, "src/episodelake"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the 0.1.0 sources are not in this checkout's git history")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(tmp_path / "old", filter="data")
    return str(tmp_path / "old" / "src")


def test_stats_of_a_dataset_written_by_0_1_0(old_release, tmp_path):
    path = str(tmp_path / "old-ds")
    env = {"PYTHONPATH": f"{old_release}:{REPO}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", OLD_WRITER, path, old_release, "5", "30"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    rng = np.random.default_rng(5)  # the writer's episodes, regenerated here
    raws = [random_episode(rng, int(rng.integers(1, 20))) for _ in range(30)]
    ds = el.Dataset.open(path)
    assert_stats_equal(ds.stats(), raws)
    pick = [r.meta["task"] == "pick" for r in raws]
    check_subset(ds, raws, pick, None)
    check_subset(ds, raws, [i % 3 == 0 for i in range(30)], ["observation/camera", "reward"])
    # new commits by this version next to 0.1.0's files: one table, one set of statistics
    more = [random_episode(rng, int(rng.integers(1, 20))) for _ in range(12)]
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in more)
    ds.flush()
    mixed = el.Dataset.open(path)
    assert_stats_equal(mixed.stats(), raws + more)
    check_subset(mixed, raws + more, [i % 2 == 1 for i in range(42)], None)
    mixed.maintenance.compact()
    assert_stats_equal(el.Dataset.open(path).stats(), raws + more)


def stat_rows(f: el.FieldSpec, values: list[np.ndarray | None], empty_as_null: bool) -> pa.Table:
    """The table columns of ``f``'s statistics for episodes with these values (None: an episode without values).

    ``empty_as_null``: an episode without values has NULL lists (as 0.1.0 wrote) or lists of zeros.
    """
    channels = f.stat_channels
    cols: dict[str, list] = {stat_column(f, p): [] for p in STAT_PARTS}
    for v in values:
        cols[stat_column(f, "count")].append(0 if v is None else v.shape[0])
        parts = {"sum": v.sum(0), "sumsq": (v * v).sum(0), "min": v.min(0), "max": v.max(0)} if v is not None else {}
        for p in STAT_PARTS[1:]:
            empty = None if empty_as_null else [0.0] * channels
            cols[stat_column(f, p)].append(empty if v is None else parts[p].tolist())
    types = {k: pa.int64() if k.endswith("/count") else pa.list_(pa.float64()) for k in cols}
    return pa.table({k: pa.array(c, types[k]) for k, c in cols.items()})


def state_field() -> el.FieldSpec:
    return next(f for f in robot_schema().step_fields if f.key == "observation/state")


@pytest.mark.parametrize("empty_as_null", [True, False])
def test_stats_table_skips_episodes_without_values(empty_as_null):
    f = state_field()
    rng = np.random.default_rng(3)
    # values above 1: a row without values taken for zeros would show in min and in std
    values = [None if i % 4 == 0 else 1 + rng.random((int(rng.integers(1, 9)), 5)) for i in range(12)]
    table = StatsTable(np.repeat([0, 1], 6), 2)
    table.fill(f, np.arange(6), stat_rows(f, values[:6], empty_as_null))  # two pieces, like two table files
    table.fill(f, np.arange(6, 12), stat_rows(f, values[6:], empty_as_null))
    rows = np.array([0, 1, 4, 5, 8, 11])
    got = table.aggregate(f, rows)
    flat = np.concatenate([values[r] for r in rows if values[r] is not None])
    assert got["count"] == len(flat)
    for m, want in (("sum", flat.sum(0)), ("mean", flat.mean(0)), ("std", flat.std(0)), ("min", flat.min(0))):
        np.testing.assert_allclose(got[m], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got["max"], flat.max(0))
    assert table.aggregate(f, np.array([0, 4, 8]))["count"] == 0  # only episodes without values


def test_stats_table_rejects_misshapen_statistics():
    f = state_field()
    good = stat_rows(f, [np.ones((2, 5)), np.ones((3, 5))], empty_as_null=True)
    short = pa.array([[1.0] * 5, [1.0] * 4], pa.list_(pa.float64()))
    bad = good.set_column(good.schema.get_field_index(stat_column(f, "min")), stat_column(f, "min"), short)
    with pytest.raises(el.CorruptionError, match=r"field 'observation/state': statistics 'min' do not hold 5 values"):
        StatsTable(np.zeros(2, np.int64), 1).fill(f, np.arange(2), bad)


def test_stats_table_rejects_a_count_without_values():
    """An episode whose count says it has values but whose lists are NULL is damage, not an empty episode."""
    f = state_field()
    good = stat_rows(f, [np.ones((2, 5)), None, np.ones((3, 5))], empty_as_null=True)
    StatsTable(np.zeros(3, np.int64), 1).fill(f, np.arange(3), good)  # the NULL row counts 0: fine
    at = good.schema.get_field_index(stat_column(f, "count"))
    bad = good.set_column(at, stat_column(f, "count"), pa.array([2, 4, 3], good.schema.field(at).type))
    with pytest.raises(el.CorruptionError, match=r"field 'observation/state': statistics 'sum' do not hold 5 values"):
        StatsTable(np.zeros(3, np.int64), 1).fill(f, np.arange(3), bad)
