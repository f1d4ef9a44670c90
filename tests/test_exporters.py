"""Exporters (Arrow, Parquet, Polars, Minari), histograms and progress bars, against the raw generated data."""

from __future__ import annotations

import fcntl
import io
import os
import select
import struct
import termios

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest

import episodelake as el
from episodelake import cli
from episodelake.core import progress
from episodelake.exporters import formats as exporters
from episodelake.importers import import_dataset
from episodelake.integrations.gymnasium import RecordEpisodes
from episodelake.integrations.plots import episode_histograms

from .test_gym_recording import flat


def by_id(raw_episodes, ds):
    """Raw episodes in the dataset's episode order (appended in order: same order)."""
    assert len(ds) == len(raw_episodes)
    return list(zip(ds.episode_ids.tolist(), raw_episodes, strict=True))


# ---------------------------------------------------------------- Arrow / Parquet / Polars


def test_episode_table_matches_raw(robot_dataset, raw_episodes):
    table = exporters.episode_table(robot_dataset)
    assert not any(c.startswith(("ref/", "crc/", "stats/")) for c in table.column_names)
    rows = table.to_pylist()
    for row, (eid, raw) in zip(rows, by_id(raw_episodes, robot_dataset), strict=True):
        assert row["episode_id"] == eid
        assert row["length"] == raw.length
        assert row["terminated"] == raw.terminated and row["truncated"] == raw.truncated
        assert row["task"] == raw.meta["task"] and row["success"] == raw.meta["success"]
        np.testing.assert_allclose(row["return"], raw.reward.astype(np.float64).sum(), rtol=1e-12)
        np.testing.assert_array_equal(np.array(row["observation/state"], np.float32), raw.obs["state"])
        np.testing.assert_array_equal(np.array(row["action"]), raw.action["action"])
    full = exporters.episode_table(robot_dataset, internal=True)
    assert "ref/observation/camera" in full.column_names and "stats/reward/sum" in full.column_names


def test_view_export_keeps_only_its_episodes(robot_dataset, raw_episodes, tmp_path):
    view = robot_dataset.where("task = 'pick'")
    want = [eid for eid, raw in by_id(raw_episodes, robot_dataset) if raw.meta["task"] == "pick"]
    table = exporters.episode_table(view, columns=["episode_id", "length"])
    assert table.column_names == ["episode_id", "length"]
    assert table.column("episode_id").to_pylist() == want
    exporters.to_parquet(view, tmp_path / "v.parquet")
    assert pq.read_table(tmp_path / "v.parquet").column("episode_id").to_pylist() == want


def test_parquet_arrow_polars_agree(robot_dataset, raw_episodes, tmp_path):
    import polars as pl
    import pyarrow.feather as feather

    exporters.to_parquet(robot_dataset, tmp_path / "e.parquet")
    exporters.to_arrow_file(robot_dataset, tmp_path / "e.arrow")
    df = exporters.to_polars(robot_dataset)
    want_ids = [eid for eid, _ in by_id(raw_episodes, robot_dataset)]
    for ids in (
        pq.read_table(tmp_path / "e.parquet").column("episode_id").to_pylist(),
        feather.read_table(tmp_path / "e.arrow").column("episode_id").to_pylist(),
        df["episode_id"].to_list(),
    ):
        assert ids == want_ids
    assert isinstance(df, pl.DataFrame)
    assert df["length"].to_list() == [raw.length for raw in raw_episodes]


def test_cli_export_parquet(robot_dataset, raw_episodes, tmp_path):
    # an in-memory dataset lives in a private tmpfs directory: its location URL reaches it while it is alive
    out = tmp_path / "x.parquet"
    assert cli.main(["export", "parquet", robot_dataset.location.url, str(out), "--where", "success"]) == 0
    want = [eid for eid, raw in by_id(raw_episodes, robot_dataset) if raw.meta["success"]]
    assert pq.read_table(out).column("episode_id").to_pylist() == want


# ---------------------------------------------------------------- Minari


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


def record(env_id, episodes, path=None, **kw):
    env = RecordEpisodes(gym.make(env_id, **kw), path)
    env.action_space.seed(0)
    for k in range(episodes):
        env.reset(seed=k)
        while True:
            _, _, te, tr, _ = env.step(env.action_space.sample())
            if te or tr:
                break
    env.close()
    return env.dataset


def check_minari_matches(mds, ds):
    assert mds.total_episodes == len(ds)
    for i, ep in enumerate(ds.episodes()):
        ref = mds[i]
        seg = ep.read()
        got_obs = seg.all_obs.flat() if isinstance(seg.all_obs, el.RoleView) else {"": seg.all_obs}
        want_obs = flat(ref.observations)
        assert got_obs.keys() == want_obs.keys()
        for k in want_obs:
            np.testing.assert_array_equal(want_obs[k], got_obs[k])
            assert want_obs[k].dtype == got_obs[k].dtype
        np.testing.assert_array_equal(ref.actions, seg.action)
        np.testing.assert_array_equal(ref.rewards, seg.reward)
        np.testing.assert_array_equal(ref.terminations, seg.terminated)
        np.testing.assert_array_equal(ref.truncations, seg.truncated)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "DictMultiDiscrete-v0"])
def test_to_minari_readable_by_minari(env_id, tmp_path, minari_root):
    import minari

    ds = record(env_id, 3)
    mds = exporters.to_minari(ds, tmp_path / "out", "test/export-v0")
    mds = minari.MinariDataset(tmp_path / "out" / "data")  # reopened by Minari alone
    check_minari_matches(mds, ds)
    assert mds.observation_space == gym.make(env_id).observation_space
    assert mds.action_space == gym.make(env_id).action_space
    assert mds.env_spec.id == env_id
    seeds = [m["seed"] for m in mds.storage.get_episode_metadata(range(3))]
    assert seeds == [0, 1, 2]


def test_to_minari_of_a_view(tmp_path, minari_root):
    ds = record("CartPole-v1", 3)
    view = ds.where("seed >= 1")
    mds = exporters.to_minari(view, tmp_path / "view")
    check_minari_matches(mds, view)
    assert mds.env_spec.id == "CartPole-v1"  # the view's dataset info (env spec, spaces) is exported
    assert mds.observation_space == gym.make("CartPole-v1").observation_space
    assert [m["seed"] for m in mds.storage.get_episode_metadata(range(2))] == [1, 2]


def test_to_minari_by_id_and_back(minari_root):
    import minari

    ds = record("Pendulum-v1", 2, max_episode_steps=15)
    exporters.to_minari(ds, None, "test/pendulum-v0")
    mds = minari.load_dataset("test/pendulum-v0")
    check_minari_matches(mds, ds)
    back = import_dataset("minari", "test/pendulum-v0", None)
    for a, b in zip(ds.episodes(), back.episodes(), strict=True):
        np.testing.assert_array_equal(a.read().all_obs, b.read().all_obs)
        assert a.meta["seed"] == b.meta["seed"]


def test_to_minari_spaces_from_schema(robot_dataset, raw_episodes, tmp_path, minari_root):
    mds = exporters.to_minari(robot_dataset, tmp_path / "robot")
    obs_space = mds.observation_space
    assert isinstance(obs_space, gym.spaces.Dict) and set(obs_space.spaces) == {"state", "camera"}
    assert obs_space["camera"].dtype == np.uint8 and obs_space["camera"].shape == (3, 8, 8)
    for i, (_, raw) in enumerate(by_id(raw_episodes, robot_dataset)):
        ref = mds[i]
        np.testing.assert_array_equal(ref.observations["camera"], raw.obs["camera"])
        np.testing.assert_array_equal(ref.observations["state"], raw.obs["state"])
        np.testing.assert_array_equal(ref.actions, raw.action["action"])
        np.testing.assert_array_equal(ref.rewards, raw.reward)
        assert bool(ref.terminations[-1]) == raw.terminated and bool(ref.truncations[-1]) == raw.truncated
    with pytest.raises(FileExistsError):
        exporters.to_minari(robot_dataset, tmp_path / "robot")


def test_cli_export_minari(tmp_path, minari_root):
    import minari

    path = str(tmp_path / "cp")
    record("CartPole-v1", 2, path)
    src = el.Dataset.open(path)
    assert cli.main(["export", "minari", path, str(tmp_path / "m"), "--dataset-id", "cp/export-v0", "--quiet"]) == 0
    check_minari_matches(minari.MinariDataset(tmp_path / "m" / "data"), src)


# ---------------------------------------------------------------- histograms


def test_histograms_match_numpy(robot_dataset, raw_episodes, tmp_path):
    import matplotlib.image

    out = tmp_path / "h.png"
    drawn = episode_histograms(robot_dataset, out, bins=7)
    returns = np.array([raw.reward.astype(np.float64).sum() for raw in raw_episodes])
    lengths = np.array([raw.length for raw in raw_episodes])
    for name, values in (("return", returns), ("length", lengths)):
        counts, edges = np.histogram(values, bins=7)
        np.testing.assert_array_equal(drawn[name][0], counts)
        np.testing.assert_allclose(drawn[name][1], edges)
    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (400, 1000)
    view = robot_dataset.where("task = 'place'")
    drawn = episode_histograms(view, tmp_path / "v.png", bins=5)
    assert drawn["length"][0].sum() == sum(raw.meta["task"] == "place" for raw in raw_episodes)


def test_cli_plot(robot_dataset, raw_episodes, tmp_path):
    from .test_cli_edges import assert_same_histograms

    out = tmp_path / "p.png"
    url = robot_dataset.location.url  # in memory too: a tmpfs directory the CLI opens by its URL
    assert cli.main(["plot", url, str(out), "--where", "task = 'pick'", "--bins", "4"]) == 0
    assert_same_histograms(out, robot_dataset.where("task = 'pick'"), tmp_path, bins=4)


# ---------------------------------------------------------------- progress


def test_progress_quiet_unless_terminal_or_forced():
    buf = io.StringIO()
    assert list(progress.track(range(5), desc="work", file=buf)) == [0, 1, 2, 3, 4]
    assert buf.getvalue() == ""  # not a terminal
    assert list(progress.track(range(5), desc="work", progress=False, file=buf)) == list(range(5))
    assert buf.getvalue() == ""
    assert list(progress.track(range(5), desc="work", progress=True, file=buf)) == list(range(5))
    assert "work" in buf.getvalue() and "5/5" in buf.getvalue()


def test_progress_draws_on_a_real_terminal():
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0x0
    with os.fdopen(slave, "w") as tty:
        assert progress.enabled(None, tty)
        assert list(progress.track(range(3), desc="tty-bar", file=tty)) == [0, 1, 2]
        tty.flush()
        written = b""
        while select.select([master], [], [], 0)[0]:  # everything already written, without waiting
            written += os.read(master, 65536)
    os.close(master)
    written = written.decode()
    assert "tty-bar" in written and "3/3" in written
    assert not progress.enabled(False, io.StringIO())
