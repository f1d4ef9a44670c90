"""SQL over episodes: views, where(), select_episodes(), stats(), time travel, partition pruning.

Every expected value is computed with NumPy from the raw generated episodes
(tests/reference.py), never from the code under test.
"""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .conftest import robot_schema
from .reference import random_episode


def scalar(collection, query: str, params=None):
    """The single value a query returns."""
    return collection.sql(query, params).fetchall()[0][0]


def ids_where(ds, raws, keep) -> list[int]:
    """Episode ids of the raw episodes for which ``keep(raw)`` holds (ids follow append order)."""
    return [int(i) for i, r in zip(ds.episode_ids, raws, strict=True) if keep(r)]


def reference_stats(raws) -> dict[str, dict[str, np.ndarray]]:
    """count/sum/mean/std/min/max straight from the raw arrays (per channel where the field has one)."""
    out = {}
    fields = {
        "observation/state": (lambda r: r.obs["state"], 1),  # channel axis: the only axis
        "observation/camera": (lambda r: r.obs["camera"], 1),  # layout CHW: channel axis 1 of [T, C, H, W]
        "action": (lambda r: r.action["action"], None),
        "reward": (lambda r: r.reward, None),
    }
    for key, (get, axis) in fields.items():
        vals = np.concatenate([get(r) for r in raws]).astype(np.float64)
        flat = vals.reshape(1, -1) if axis is None else np.moveaxis(vals, axis, 0).reshape(vals.shape[axis], -1)
        out[key] = {
            "count": flat.shape[1],
            "sum": flat.sum(1),
            "mean": flat.mean(1),
            "std": flat.std(1),
            "min": flat.min(1),
            "max": flat.max(1),
        }
    lengths = np.array([r.length for r in raws], dtype=np.float64)
    returns = np.array([r.reward.astype(np.float64).sum() for r in raws])
    for key, v in (("length", lengths), ("return", returns)):
        out[key] = {"count": len(v), "sum": v.sum(), "mean": v.mean(), "std": v.std(), "min": v.min(), "max": v.max()}
    return out


def assert_stats_equal(got: dict, raws) -> None:
    want = reference_stats(raws)
    assert got["episodes"]["count"] == len(raws)
    for key, ref in want.items():
        assert got[key]["count"] == ref["count"], key
        for m in ("sum", "mean", "std", "min", "max"):
            value = got[key][m]
            if key in ("observation/state", "observation/camera"):
                assert np.shape(value) == ref[m].shape, (key, m)
            else:  # fields without a channel axis give plain floats
                assert isinstance(value, float), (key, m)
            np.testing.assert_allclose(value, np.squeeze(ref[m]), rtol=1e-9, atol=1e-9, err_msg=f"{key}/{m}")


def test_episodes_view_matches_raw(robot_dataset, raw_episodes):
    got = robot_dataset.sql(
        "SELECT episode_id, length, return, task, success, terminated, truncated, created_at "
        "FROM episodes ORDER BY created_at, episode_id"
    ).fetchnumpy()
    np.testing.assert_array_equal(got["episode_id"], robot_dataset.episode_ids)
    np.testing.assert_array_equal(got["length"], [r.length for r in raw_episodes])
    np.testing.assert_allclose(got["return"], [r.reward.astype(np.float64).sum() for r in raw_episodes], rtol=1e-12)
    assert got["task"].tolist() == [r.meta["task"] for r in raw_episodes]
    assert got["success"].tolist() == [r.meta["success"] for r in raw_episodes]
    assert got["terminated"].tolist() == [r.terminated for r in raw_episodes]
    assert got["truncated"].tolist() == [r.truncated for r in raw_episodes]
    # list columns come back as arrays with the episode's time axis
    state = robot_dataset.sql(
        'SELECT "observation/state" AS s FROM episodes WHERE episode_id = ?', [int(robot_dataset.episode_ids[0])]
    ).fetchnumpy()["s"]
    np.testing.assert_array_equal(state[0], raw_episodes[0].obs["state"])


def test_steps_view_matches_raw(robot_dataset, raw_episodes):
    got = robot_dataset.sql(
        'SELECT s.episode_id, s.t, s."observation/state", s."next_observation/state", s.action, s.reward, '
        "s.terminated, s.truncated FROM steps s JOIN episodes e USING (episode_id) "
        "ORDER BY e.created_at, s.episode_id, t"
    ).fetchnumpy()
    n = sum(r.length for r in raw_episodes)
    np.testing.assert_array_equal(
        got["episode_id"], np.repeat(robot_dataset.episode_ids, [r.length for r in raw_episodes])
    )
    np.testing.assert_array_equal(got["t"], np.concatenate([np.arange(r.length) for r in raw_episodes]))
    np.testing.assert_array_equal(got["observation/state"], np.concatenate([r.obs["state"][:-1] for r in raw_episodes]))
    np.testing.assert_array_equal(
        got["next_observation/state"], np.concatenate([r.obs["state"][1:] for r in raw_episodes])
    )
    np.testing.assert_array_equal(got["action"], np.concatenate([r.action["action"] for r in raw_episodes]))
    np.testing.assert_array_equal(got["reward"], np.concatenate([r.reward for r in raw_episodes]))
    last = np.cumsum([r.length for r in raw_episodes]) - 1
    term = np.zeros(n, bool)
    term[last] = [r.terminated for r in raw_episodes]
    trunc = np.zeros(n, bool)
    trunc[last] = [r.truncated for r in raw_episodes]
    np.testing.assert_array_equal(got["terminated"], term)
    np.testing.assert_array_equal(got["truncated"], trunc)
    # tensor fields stay out of steps (they are read through the sampler)
    cols = robot_dataset.sql("SELECT * FROM steps LIMIT 0").columns
    assert not any("camera" in c for c in cols)


def test_where_returns_view_of_matching_episodes(robot_dataset, raw_episodes):
    view = robot_dataset.where("task = 'pick' AND success")
    want = ids_where(robot_dataset, raw_episodes, lambda r: r.meta["task"] == "pick" and r.meta["success"])
    assert isinstance(view, el.DatasetView)
    assert view.episode_ids.tolist() == want
    assert len(view) == len(want)
    assert view.num_steps == sum(r.length for r in raw_episodes if r.meta["task"] == "pick" and r.meta["success"])
    raw_by_id = dict(zip(robot_dataset.episode_ids.tolist(), raw_episodes, strict=True))
    for i in range(len(view)):
        ep = view.episode(i)
        np.testing.assert_array_equal(ep.read().obs.camera, raw_by_id[ep.episode_id].obs["camera"][:-1])
    # the view's SQL sees only the view's episodes, in both views
    assert scalar(view, "SELECT count(*) FROM episodes") == len(want)
    assert sorted(r[0] for r in view.sql("SELECT DISTINCT episode_id FROM steps").fetchall()) == sorted(want)


def test_views_compose(robot_dataset, raw_episodes):
    chained = robot_dataset.where("task = 'pick'").where("length > 10")
    direct = robot_dataset.where("task = 'pick' AND length > 10")
    want = ids_where(robot_dataset, raw_episodes, lambda r: r.meta["task"] == "pick" and r.length > 10)
    assert chained.episode_ids.tolist() == direct.episode_ids.tolist() == want
    assert chained.dataset is robot_dataset
    # a predicate true for episodes outside the view cannot widen it
    assert robot_dataset.where("task = 'pick'").where("task = 'place'").episode_ids.tolist() == []


def test_select_episodes(robot_dataset, raw_episodes):
    view = robot_dataset.select_episodes("SELECT episode_id FROM steps WHERE reward > 1.5")  # duplicates count once
    want = ids_where(robot_dataset, raw_episodes, lambda r: (r.reward > 1.5).any())
    assert view.episode_ids.tolist() == want
    # composes with where() and stays inside a view
    sub = robot_dataset.where("success").select_episodes("SELECT episode_id FROM episodes WHERE length >= 20")
    assert sub.episode_ids.tolist() == ids_where(
        robot_dataset, raw_episodes, lambda r: r.meta["success"] and r.length >= 20
    )


def test_select_episodes_rejects_foreign_ids(robot_dataset):
    with pytest.raises(el.QueryError, match="not in snapshot"):
        robot_dataset.select_episodes("SELECT 12345 AS episode_id")
    pick = robot_dataset.where("task = 'pick'")
    place_id = int(robot_dataset.where("task = 'place'").episode_ids[0])
    with pytest.raises(el.QueryError, match="not in this view"):
        pick.select_episodes(f"SELECT {place_id} AS episode_id")
    with pytest.raises(el.QueryError, match="episode_id column"):
        robot_dataset.select_episodes("SELECT length FROM episodes")


@pytest.mark.parametrize(
    "bad",
    ["task = ", "no_such_column > 1", "1=1) UNION SELECT 1 --", "true; DROP VIEW episodes", "", None],
)
def test_where_rejects_invalid_predicates(robot_dataset, bad):
    with pytest.raises(el.QueryError, match="where"):
        robot_dataset.where(bad)
    assert scalar(robot_dataset, "SELECT count(*) FROM episodes") == len(robot_dataset)


def test_sql_errors_are_query_errors(robot_dataset):
    with pytest.raises(el.QueryError, match="nope"):
        robot_dataset.sql("SELECT nope FROM episodes")
    with pytest.raises(el.QueryError):
        robot_dataset.sql("   ")


def test_relations_stay_valid_across_queries(robot_dataset):
    first = robot_dataset.sql("SELECT episode_id FROM episodes ORDER BY episode_id")
    reader = first.arrow()  # an open streaming result
    second = scalar(robot_dataset, "SELECT count(*) FROM steps")
    assert second == robot_dataset.num_steps
    assert reader.read_all().column("episode_id").to_pylist() == sorted(robot_dataset.episode_ids.tolist())


def test_sql_params(robot_dataset, raw_episodes):
    got = scalar(robot_dataset, "SELECT count(*) FROM episodes WHERE length > ? AND task = ?", [5, "place"])
    assert got == sum(r.length > 5 and r.meta["task"] == "place" for r in raw_episodes)


def test_where_binds_parameters(robot_dataset, raw_episodes):
    view = robot_dataset.where("task = ? AND length > ?", ["pick", 5])
    assert view.episode_ids.tolist() == ids_where(
        robot_dataset, raw_episodes, lambda r: r.meta["task"] == "pick" and r.length > 5
    )
    named = robot_dataset.where("task = $task AND NOT success", {"task": "place"})
    assert named.episode_ids.tolist() == ids_where(
        robot_dataset, raw_episodes, lambda r: r.meta["task"] == "place" and not r.meta["success"]
    )
    # a view binds too and stays within itself
    short = view.where("length <= ?", [20])
    assert short.episode_ids.tolist() == ids_where(
        robot_dataset, raw_episodes, lambda r: r.meta["task"] == "pick" and 5 < r.length <= 20
    )
    # a bound value is a value, never SQL
    assert len(robot_dataset.where("task = ?", ["pick' OR true --"])) == 0
    ids = robot_dataset.episode_ids[::2].tolist()
    assert robot_dataset.where("list_contains(?, episode_id)", [ids]).episode_ids.tolist() == ids
    picked = robot_dataset.select_episodes("SELECT episode_id FROM episodes WHERE list_contains(?, episode_id)", [ids])
    assert picked.episode_ids.tolist() == ids
    for predicate, params in (("length > ?", None), ("length > ?", [1, 2]), ("length > $n", {"m": 1})):
        with pytest.raises(el.QueryError, match="where"):
            robot_dataset.where(predicate, params)


@pytest.mark.parametrize(
    ("predicate", "keep"),
    [
        ('"stats/reward/count" > 10', lambda r: r.length > 10),  # statistics are not among the in-memory columns
        ('len("observation/state") > 10', lambda r: r.length + 1 > 10),  # nor are per-step lists
        ("episode_id IN (SELECT episode_id FROM steps WHERE reward > 0.5)", lambda r: (r.reward > 0.5).any()),
        ("{'n': length}.n > 10", lambda r: r.length > 10),  # braces are SQL, not a format string
        ("length > 10 -- a trailing comment", lambda r: r.length > 10),
    ],
)
def test_where_over_any_column_of_episodes(robot_dataset, raw_episodes, predicate, keep):
    assert robot_dataset.where(predicate).episode_ids.tolist() == ids_where(robot_dataset, raw_episodes, keep)
    pick = robot_dataset.where("task = 'pick'")
    assert pick.where(predicate).episode_ids.tolist() == ids_where(
        robot_dataset, raw_episodes, lambda r: r.meta["task"] == "pick" and keep(r)
    )


def test_stats_match_numpy(robot_dataset, raw_episodes):
    assert_stats_equal(robot_dataset.stats(), raw_episodes)
    view = robot_dataset.where("task = 'place'")
    assert_stats_equal(view.stats(), [r for r in raw_episodes if r.meta["task"] == "place"])
    first = robot_dataset.stats()  # whole-dataset moments are kept per snapshot: each call owns its dicts
    first["length"]["mean"] = first["return"]["max"] = -1.0
    assert_stats_equal(robot_dataset.stats(), raw_episodes)


def test_stats_field_selection_and_errors(robot_dataset, raw_episodes):
    got = robot_dataset.stats(["reward"])
    assert set(got) == {"episodes", "length", "return", "reward"}
    np.testing.assert_allclose(
        got["reward"]["mean"], np.concatenate([r.reward for r in raw_episodes]).mean(), rtol=1e-6
    )
    with pytest.raises(el.QueryError, match="'nope'"):
        robot_dataset.stats(["nope"])
    with pytest.raises(el.QueryError, match="'task'"):
        robot_dataset.stats(["task"])


def test_stats_of_empty_subset(robot_dataset):
    got = robot_dataset.where("false").stats()
    assert got["episodes"]["count"] == 0
    assert got["reward"]["count"] == 0
    assert np.isnan(got["reward"]["mean"]) and np.isnan(got["observation/state"]["std"]).all()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(min_len=st.integers(0, 45), tasks=st.sets(st.sampled_from(["pick", "place"])), success=st.booleans())
def test_stats_of_any_subset_match_numpy(robot_dataset, raw_episodes, min_len, tasks, success):
    in_list = ", ".join(f"'{t}'" for t in sorted(tasks)) or "NULL"
    view = robot_dataset.where(f"length >= {min_len} AND task IN ({in_list})").where(
        "success" if success else "NOT success"
    )

    def keep(r) -> bool:
        return r.length >= min_len and r.meta["task"] in tasks and r.meta["success"] == success

    subset = [r for r in raw_episodes if keep(r)]
    assert view.episode_ids.tolist() == ids_where(robot_dataset, raw_episodes, keep)
    if subset:
        assert_stats_equal(view.stats(), subset)
    else:
        assert view.stats()["episodes"]["count"] == 0


def test_time_travel(tmp_path):
    rng = np.random.default_rng(7)
    first = [random_episode(rng, int(rng.integers(2, 20))) for _ in range(5)]
    second = [random_episode(rng, int(rng.integers(2, 20))) for _ in range(4)]
    path = str(tmp_path / "tt")
    ds = el.Dataset.create(robot_schema(), path, partition_by=["task"])
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in first)
    v1 = ds.flush()
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in second)
    ds.flush()
    old = el.Dataset.open(path, version=v1)
    assert scalar(old, "SELECT count(*) FROM episodes") == len(first)
    assert scalar(old, "SELECT count(*) FROM steps") == sum(r.length for r in first)
    assert_stats_equal(old.stats(), first)
    assert_stats_equal(el.Dataset.open(path).stats(), first + second)
    assert old.where("task = 'pick'").episode_ids.tolist() == ids_where(old, first, lambda r: r.meta["task"] == "pick")


def test_view_is_pinned_to_its_snapshot(robot_dataset, raw_episodes):
    view = robot_dataset.where("true")
    extra = random_episode(np.random.default_rng(3), 6)
    robot_dataset.append_episodes([extra.as_dict(unwrap_action=True)])
    robot_dataset.flush()
    assert scalar(robot_dataset, "SELECT count(*) FROM episodes") == len(raw_episodes) + 1
    assert scalar(view, "SELECT count(*) FROM episodes") == len(raw_episodes)
    assert_stats_equal(robot_dataset.stats(), [*raw_episodes, extra])
    assert_stats_equal(view.stats(), raw_episodes)


def test_storage_encodings_show_true_values(tmp_path):
    """SQL sees the storage value of unsigned/float16 fields: widened, so values (and stats) are true."""
    schema = el.DatasetSchema(
        [
            el.FieldSpec("level", (2,), "uint8"),
            el.FieldSpec("half", (), "float16", role="extra"),
            el.FieldSpec("action", (), "uint16", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    rng = np.random.default_rng(5)
    eps = []
    for _ in range(3):
        t = int(rng.integers(2, 6))
        eps.append(
            {
                "observations": {"level": rng.integers(128, 256, (t + 1, 2), dtype=np.uint8)},
                "actions": rng.integers(40000, 65536, t, dtype=np.uint16),
                "rewards": rng.standard_normal(t).astype(np.float32),
                "extras": {"half": rng.standard_normal(t).astype(np.float16)},
            }
        )
    ds = el.Dataset.from_episodes(eps, str(tmp_path / "enc"), schema=schema)
    got = ds.sql('SELECT "observation/level", action, "extra/half" FROM steps ORDER BY episode_id, t').fetchnumpy()
    np.testing.assert_array_equal(
        got["observation/level"], np.concatenate([e["observations"]["level"][:-1] for e in eps])
    )
    np.testing.assert_array_equal(got["action"], np.concatenate([e["actions"] for e in eps]))
    np.testing.assert_array_equal(
        got["extra/half"], np.concatenate([e["extras"]["half"] for e in eps]).astype(np.float32)
    )
    stats = ds.stats()
    levels = np.concatenate([e["observations"]["level"] for e in eps]).astype(np.float64)
    np.testing.assert_array_equal(stats["observation/level"]["max"], levels.max(0))
    np.testing.assert_allclose(stats["action"]["mean"], np.concatenate([e["actions"] for e in eps]).mean(), rtol=1e-12)


def test_empty_dataset():
    ds = el.Dataset.create(robot_schema(), None)
    assert scalar(ds, "SELECT count(*) FROM episodes") == 0
    assert scalar(ds, "SELECT count(*) FROM steps") == 0
    assert len(ds.where("true")) == 0
    assert ds.stats()["episodes"]["count"] == 0


class OpenCounter(LocalFileSystem):
    """The real local filesystem, recording which Parquet files are opened."""

    opened: list[str]

    def _open(self, path, *args, **kwargs):
        if str(path).endswith(".parquet"):
            self.opened.append(str(path))
        return super()._open(path, *args, **kwargs)


def count_opened(ds, query: str) -> list[str]:
    """Parquet files opened while ``query`` runs on ``ds``'s snapshot (its Arrow dataset on a counting fs)."""
    fs = OpenCounter(skip_instance_cache=True)
    fs.opened = []
    snap = ds.snapshot()
    table = getattr(ds, "dataset", ds)._store.table
    root = table.loc.delta_uri()  # the table lists file paths relative to its root
    counted = table.dt.to_pyarrow_dataset(
        filesystem=pafs.SubTreeFileSystem(root, pafs.PyFileSystem(pafs.FSSpecHandler(fs)))
    )
    snap.arrow_dataset = lambda: counted  # instrumentation: same table, same files, counted opens
    ds.sql(query).fetchall()
    return fs.opened


def test_partition_pruning_reads_only_matching_files(tmp_path, raw_episodes):
    ds = el.Dataset.create(robot_schema(), str(tmp_path / "pp"), partition_by=["task"])
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in raw_episodes)
    ds.flush()
    files = fsspec.filesystem("file").glob(str(tmp_path / "pp" / "episodes" / "**" / "*.parquet"))
    pick_files = [f for f in files if "task=pick" in f]
    assert 0 < len(pick_files) < len(files)
    every = count_opened(ds, "SELECT count(*) FROM episodes WHERE success")
    assert sorted(set(every)) == sorted(files)
    pruned = count_opened(ds, "SELECT count(*), sum(length) FROM episodes WHERE task = 'pick' AND success")
    assert sorted(set(pruned)) == sorted(pick_files)
    # a view's restriction does not stop pruning of the view's own queries
    view = ds.where("success")
    view_snap = view.snapshot()
    assert view_snap is ds.snapshot()
    pruned_view = count_opened(view, "SELECT count(*) FROM episodes WHERE task = 'pick'")
    assert sorted(set(pruned_view)) == sorted(pick_files)


def test_stats_of_a_vector_reward_dataset_count_no_returns(tmp_path):
    """A vector reward has no scalar return (the column is NULL): stats() counts none, whole or a view."""
    schema = el.DatasetSchema(
        [
            el.FieldSpec("obs", (2,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (2,), "float32", role="reward"),
        ]
    )
    lengths = [3, 5, 2, 4]
    eps = [
        {
            "observations": {"obs": np.full((t + 1, 2), t, np.float32)},
            "actions": np.arange(t, dtype=np.int64),
            "rewards": np.ones((t, 2), np.float32),
        }
        for t in lengths
    ]
    ds = el.Dataset.from_episodes(eps, str(tmp_path / "vector-reward"), schema=schema)
    for subset, want in ((ds, lengths), (ds.where("length > 2"), [3, 5, 4])):
        got = subset.stats()
        assert got["return"]["count"] == 0 and np.isnan(got["return"]["mean"])
        assert got["length"]["count"] == len(want) and got["length"]["sum"] == sum(want)
        assert got["length"]["min"] == min(want) and got["length"]["max"] == max(want)
