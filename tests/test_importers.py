"""Importers, each checked value by value against data made by the real peer package (or, for D4RL, by hand)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake import cli
from episodelake.importers import import_dataset
from episodelake.importers.common import action_out_episode
from episodelake.importers.d4rl import episode_bounds

from .test_gym_recording import flat


def assert_same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    np.testing.assert_array_equal(a, b)


def role_dict(view):
    """A segment role (bare array or RoleView) as {name: array}."""
    return view.flat() if isinstance(view, el.RoleView) else {"": view}


# ---------------------------------------------------------------- D4RL (hand-built reference)


def d4rl_reference(obs, actions, rewards, terminals, timeouts, next_obs=None):
    """Row-by-row split into expected episodes: (obs rows, actions, rewards, terminated, truncated, index)."""
    runs, cur = [], []
    for t in range(len(rewards)):
        cur.append(t)
        if terminals[t] or timeouts[t]:
            runs.append((cur, bool(terminals[t]), bool(timeouts[t]) and not terminals[t]))
            cur = []
    if cur:
        runs.append((cur, False, False))
    out = []
    for i, (rows, te, tr) in enumerate(runs):
        if next_obs is not None:
            out.append(([obs[t] for t in rows] + [next_obs[rows[-1]]], rows, te, tr, i))
        elif te:  # terminal without its next observation: every transition, last observation repeated
            out.append(([obs[t] for t in rows] + [obs[rows[-1]]], rows, te, tr, i))
        elif len(rows) > 1:  # timeout or unfinished: the last transition has no next observation
            out.append(([obs[t] for t in rows], rows[:-1], te, tr, i))
    return [(np.stack(o), actions[r], rewards[r], te, tr, i) for o, r, te, tr, i in out]


def make_d4rl(rng, n=60):
    terminals = np.zeros(n, bool)
    timeouts = np.zeros(n, bool)
    terminals[[4, 5, 20, 33]] = True  # 5: a one-row episode
    timeouts[[12, 33, 45]] = True  # 33: both set, terminal wins
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    next_obs = np.concatenate([obs[1:], rng.normal(size=(1, 3)).astype(np.float32)])
    ends = np.flatnonzero(terminals | timeouts)
    next_obs[ends] = rng.normal(size=(len(ends), 3))  # across a boundary the next obs is the episode's own
    return {
        "observations": obs,
        "actions": rng.normal(size=(n, 2)).astype(np.float32),
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
        "next_observations": next_obs,
        "infos/qpos": rng.normal(size=(n, 4)),
    }


def acts_rows(data, idx, n):
    """Rows of the idx-th split run (the reference's split, recomputed) that carry its n transitions."""
    ends = np.flatnonzero(data["terminals"] | data["timeouts"]).tolist()
    starts = [0] + [e + 1 for e in ends]
    return np.arange(starts[idx], starts[idx] + n)


def check_d4rl(ds, data, with_next):
    ref = d4rl_reference(
        data["observations"],
        data["actions"],
        data["rewards"],
        data["terminals"],
        data["timeouts"],
        data["next_observations"] if with_next else None,
    )
    assert len(ds) == len(ref)
    for ep, (obs, acts, rews, te, tr, idx) in zip(ds.episodes(), ref, strict=True):
        seg = ep.read()
        assert_same(seg.all_obs, obs)
        assert_same(seg.action, acts)
        assert_same(seg.reward, rews)
        assert (ep.terminated, ep.truncated) == (te, tr)
        assert ep.meta["source_episode"] == idx
        assert_same(seg.data["extra/qpos"], data["infos/qpos"][acts_rows(data, idx, len(acts))])


@pytest.mark.parametrize("with_next", [True, False])
def test_d4rl_dict_import(with_next):
    full = make_d4rl(np.random.default_rng(0))
    data = {k: v for k, v in full.items() if with_next or k != "next_observations"}
    ds = import_dataset("d4rl", data, None)
    check_d4rl(ds, full, with_next)
    assert ds.info["source"]["next_observations"] is with_next


def test_d4rl_files_and_cli(tmp_path):
    import h5py

    data = make_d4rl(np.random.default_rng(1))
    with h5py.File(tmp_path / "d.hdf5", "w") as f:
        for k, v in data.items():
            f[k] = v
        f["metadata/algorithm"] = 1
    np.savez(tmp_path / "d.npz", **data)
    ds = el.importers.d4rl.load(str(tmp_path / "d.hdf5"), str(tmp_path / "a"))
    check_d4rl(el.Dataset.open(str(tmp_path / "a")), data, True)
    assert cli.main(["import", "d4rl", str(tmp_path / "d.npz"), str(tmp_path / "b")]) == 0
    check_d4rl(el.Dataset.open(str(tmp_path / "b")), data, True)
    assert len(ds) == len(el.Dataset.open(str(tmp_path / "b")))


def test_d4rl_next_observation_mismatch_names_row():
    data = make_d4rl(np.random.default_rng(2))
    data["next_observations"][8, 1] += 1.0  # row 8 is inside episode rows 6..12
    with pytest.raises(el.ValidationError, match="row 8"):
        import_dataset("d4rl", data, None)
    ds = import_dataset("d4rl", data, None, strict=False)  # observations are the truth inside an episode
    check_d4rl(ds, data, True)


def readme_d4rl_data() -> dict[str, np.ndarray]:
    """The README's D4RL example ("Coming from another format"), same seed."""
    rng = np.random.default_rng(0)
    return {
        "observations": rng.normal(size=(1000, 11)).astype(np.float32),
        "actions": rng.normal(size=(1000, 3)).astype(np.float32),
        "rewards": rng.normal(size=1000).astype(np.float32),
        "terminals": rng.random(1000) < 0.01,
        "timeouts": np.arange(1000) % 200 == 199,
    }


def test_d4rl_without_next_observations_keeps_every_end_flag():
    data = readme_d4rl_data()
    terminals, timeouts, rewards = data["terminals"], data["timeouts"], data["rewards"]
    # ground truth by a plain loop over the rows: one outcome per run ending at a flagged row
    outcomes, kept_reward, start = [], 0.0, 0
    for t in range(len(rewards)):
        if terminals[t] or timeouts[t]:
            outcomes.append("terminated" if terminals[t] else "truncated")
            stop = t + 1 if terminals[t] else t  # a terminal reward is kept, a timeout row has no next observation
            kept_reward += float(rewards[start:stop].astype(np.float64).sum())
            start = t + 1
    kept_reward += float(rewards[start : len(rewards) - 1].astype(np.float64).sum())  # unfinished rest
    assert (outcomes.count("terminated"), outcomes.count("truncated")) == (9, 5)  # what the README data holds

    ds = import_dataset("d4rl", data, None)
    got = ds.sql("SELECT terminated, truncated, return FROM episodes").fetchnumpy()
    assert int(got["terminated"].sum()) == outcomes.count("terminated") == int(terminals.sum())
    assert int(got["truncated"].sum()) == outcomes.count("truncated") == int((timeouts & ~terminals).sum())
    np.testing.assert_allclose(got["return"].sum(), kept_reward, rtol=1e-9)
    for ep in ds.episodes():
        seg = ep.read()
        last = acts_rows(data, int(ep.meta["source_episode"]), len(seg))[-1]
        if ep.terminated:  # the terminal transition itself is kept, its reward and action included
            assert bool(terminals[last])
            assert_same(seg.reward[-1], rewards[last])
            assert_same(seg.all_obs[-1], seg.all_obs[-2])  # documented placeholder for the unrecorded row
        elif ep.truncated:  # ends one row before the timeout row, at an observation that was recorded
            assert bool(timeouts[last + 1])
            assert_same(seg.all_obs[-1], data["observations"][last + 1])
    assert ds.info["source"]["skipped_episodes"] == []
    assert ds.info["source"]["terminal_final_observation"] == "repeats the last observation"


def test_d4rl_one_row_timeout_is_skipped_loudly():
    data = readme_d4rl_data()
    data["terminals"][:] = False
    data["terminals"][398] = True  # the timeout row 399 is then an episode of one row
    with pytest.warns(UserWarning, match="1 one-row episode"):
        ds = import_dataset("d4rl", data, None)
    bounds = episode_bounds(data["terminals"], data["timeouts"])
    one_row = [i for i, (a, b) in enumerate(bounds) if b - a == 1]
    assert ds.info["source"]["skipped_episodes"] == one_row
    assert len(ds) == len(bounds) - 1
    assert int(ds.sql("SELECT count(*) AS n FROM episodes WHERE terminated").fetchnumpy()["n"][0]) == 1


def test_failed_import_leaves_nothing(tmp_path):
    data = make_d4rl(np.random.default_rng(3))
    data["next_observations"][50, 0] += 1.0  # fails in the last episode, after earlier commits
    dst = tmp_path / "ds"
    with pytest.raises(el.ValidationError, match="row 50"):
        import_dataset("d4rl", data, str(dst), commit_bytes=1)  # one commit per episode before the bad one
    assert not dst.exists()
    with pytest.raises(el.ValidationError, match="rows"):
        import_dataset("d4rl", {**data, "rewards": data["rewards"][:-1]}, str(dst))
    assert not dst.exists()


def test_import_commits_once_per_batch(tmp_path):
    rows = 3_000
    data = {
        "observations": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2),
        "actions": np.zeros((rows, 1), np.float32),
        "rewards": np.ones(rows, np.float32),
        "terminals": np.arange(rows) % 3 == 2,  # 1,000 three-row episodes
    }
    ds = import_dataset("d4rl", data, str(tmp_path / "one"))
    assert len(ds) == 1_000 and ds.version == 1  # one table commit after the create
    # commit_bytes bounds a batch: each episode (3 transitions, 4 observation rows) holds 4*8 + 3*4 + 3*4 = 56 bytes
    ds = import_dataset("d4rl", data, str(tmp_path / "many"), commit_bytes=56 * 100)
    assert len(ds) == 1_000 and ds.version == 10  # batches of 100 episodes


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_action_out_split_matches_reference(draw):
    n = draw.draw(st.integers(1, 30))
    terminals = np.array(draw.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    timeouts = np.array(draw.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    with_next = draw.draw(st.booleans())
    obs = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    next_obs = obs + 0.5 if with_next else None
    acts, rews = np.arange(n) * 10, np.arange(n) * 0.25
    got = []
    for a, b in episode_bounds(terminals, timeouts):
        ep = action_out_episode(
            {"o": obs[a:b]},
            {"a": acts[a:b]},
            {"r": rews[a:b]},
            next_observations=None if next_obs is None else {"o": next_obs[a:b]},
            terminated=terminals[b - 1],
            truncated=timeouts[b - 1],
            strict=False,
        )
        if ep is not None:
            got.append(ep)
    ref = d4rl_reference(obs, acts, rews, terminals, timeouts, next_obs)
    assert len(got) == len(ref)
    for ep, (o, a, r, te, tr, _) in zip(got, ref, strict=True):
        assert_same(ep["observations"]["o"], o)
        assert_same(ep["actions"]["a"], a)
        assert_same(ep["rewards"]["r"], r)
        assert (ep["terminated"], ep["truncated"]) == (te, tr)


# ---------------------------------------------------------------- Minari (real DataCollector)


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("minari")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(root))
        yield root


def collect_minari(env, dataset_id, episodes, seed0=0):
    import minari

    collector = minari.DataCollector(env, record_infos=True, data_format="hdf5")
    collector.action_space.seed(seed0)
    for k in range(episodes):
        collector.reset(seed=seed0 + k if k != 1 else None)
        while True:
            _, _, te, tr, _ = collector.step(collector.action_space.sample())
            if te or tr:
                break
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari warns about missing author/description metadata
        return collector.create_dataset(dataset_id=dataset_id, algorithm_name="random")


MINARI_ENVS = {
    "cartpole": lambda: gym.make("CartPole-v1"),
    "pendulum": lambda: gym.make("Pendulum-v1", max_episode_steps=25),
    "dictmd": lambda: gym.make("DictMultiDiscrete-v0", max_episode_steps=40),
}


@pytest.mark.parametrize("name", list(MINARI_ENVS))
def test_minari_import_matches_minari_reader(name, minari_root, tmp_path):
    mds = collect_minari(MINARI_ENVS[name](), f"test/{name}-v0", episodes=4)
    path = str(minari_root / "test" / f"{name}-v0")
    ds = import_dataset("minari", path, str(tmp_path / "ds"))
    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert len(ds) == mds.total_episodes == 4
    seeds = [m.get("seed") for m in mds.storage.get_episode_metadata(range(4))]
    assert seeds[0] == 0  # minari records a generated seed for the unseeded reset
    for i in range(4):
        ref = mds[i]
        ep = ds.episode(i)
        seg = ep.read()
        want_obs = flat(ref.observations)
        got_obs = role_dict(seg.all_obs)
        assert got_obs.keys() == want_obs.keys()
        for k in want_obs:
            assert_same(got_obs[k], want_obs[k])
        assert_same(seg.action, ref.actions)
        assert_same(seg.reward, ref.rewards)
        assert_same(seg.terminated, ref.terminations.astype(bool))
        assert_same(seg.truncated, ref.truncations.astype(bool) & ~ref.terminations.astype(bool))
        assert ep.meta["seed"] == seeds[i] and ep.meta["source_episode"] == ref.id
        for k, v in flat(ref.infos).items():
            assert_same(seg.data[f"extra/{k}"], v[1:])
    assert ds.info["source"]["dataset_id"] == f"test/{name}-v0"
    assert ds.info["env_id"] == mds.env_spec.id
    from episodelake.integrations.gymnasium import space_from_json

    assert space_from_json(ds.info["observation_space"]) == mds.observation_space


def test_minari_import_by_id(minari_root):
    collect_minari(gym.make("CartPole-v1"), "test/byid-v0", episodes=2, seed0=5)
    ds = import_dataset("minari", "test/byid-v0", None, infos=False)
    assert len(ds) == 2 and not ds.schema.role_fields("extra")


# ---------------------------------------------------------------- memmap-replay-buffer (real ReplayBuffer)


@pytest.fixture(scope="module")
def replay_folders(tmp_path_factory):
    from memmap_replay_buffer import ReplayBuffer

    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("mrb")
    fields = {
        "state": ("float", (3,)),
        "image": ("uint8", (3, 24, 24)),
        "action": ("int", (2,)),
        "reward": "float",
        "done": "bool",
    }
    plain = ReplayBuffer(
        root / "plain", max_episodes=4, max_timesteps=20, fields=fields, meta_fields={"task_id": "int"}, circular=True
    )
    for e in range(6):  # wraps: slots 2, 3, 0, 1 hold episodes 2..5, oldest first
        length = int(rng.integers(1, 15))
        with plain.one_episode(task_id=e):
            for t in range(length):
                plain.store(
                    state=rng.normal(size=3).astype(np.float32),
                    image=rng.integers(0, 256, (3, 24, 24), dtype=np.uint8),
                    action=rng.integers(0, 5, 2),
                    reward=float(rng.normal()),
                    done=t == length - 1 and e % 2 == 0,
                )
    plain.store(state=np.ones(3, np.float32), action=np.ones(2, np.int32))  # an unfinished episode in slot 2
    plain.flush()

    nxt = ReplayBuffer(
        root / "next",
        max_episodes=5,
        max_timesteps=12,
        fields={"state": ("float", (2,)), "next_state": ("float", (2,)), "action": "int", "reward": "float"},
    )
    for _ in range(3):
        n = int(rng.integers(1, 12))
        states = rng.normal(size=(n + 1, 2)).astype(np.float32)
        actions, rewards = rng.integers(0, 3, n), rng.normal(size=n)
        nxt.store_episode(state=states[:-1], next_state=states[1:], action=actions, reward=rewards)
    return root


def peer_episodes(folder):
    """Episodes as memmap-replay-buffer's own trajectory dataset reads them, by slot."""
    from memmap_replay_buffer import ReplayBuffer

    buf = ReplayBuffer.from_folder(folder, read_only=True)
    out = {}
    for item in buf.dataset(return_indices=True):
        out[int(item["_index"])] = {k: v.numpy() for k, v in item.items() if not k.startswith("_")}
    return out


def test_memmap_replay_import_matches_peer_reader(replay_folders, tmp_path):
    folder = replay_folders / "plain"
    ds = import_dataset("memmap-replay", str(folder), str(tmp_path / "ds"))
    peer = peer_episodes(folder)
    slots = [int(ep.meta["source_episode"]) for ep in ds.episodes()]
    # oldest first; slot 2 is being rewritten; an unfinished 1-row episode has no transition
    assert slots == [s for s in (3, 0, 1) if len(peer[s]["reward"]) > 1 or peer[s]["done"][-1]]
    assert ds.schema["observation/image"].in_tensor
    for ep, slot in zip(ds.episodes(), slots, strict=True):
        ref = peer[slot]
        seg = ep.read()
        n = len(ref["reward"])
        done = bool(ref["done"][-1])
        # a terminal episode keeps its terminal transition (final observation row repeated), others drop the last
        kept = n if done else n - 1
        assert len(seg) == kept and ep.terminated is done and not ep.truncated
        last = [-1] if done else []
        assert_same(seg.all_obs["state"], ref["state"][np.r_[np.arange(n), last].astype(int)])
        assert_same(seg.all_obs["image"], ref["image"][np.r_[np.arange(n), last].astype(int)])
        assert_same(seg.action, ref["action"][:kept])
        assert_same(seg.reward, ref["reward"][:kept])
        assert ep.meta["task_id"] == ref["task_id"]


def test_memmap_replay_next_state_keeps_every_transition(replay_folders):
    folder = replay_folders / "next"
    ds = el.importers.memmap_replay.load(str(folder))
    peer = peer_episodes(folder)
    assert len(ds) == len(peer) == 3
    for ep in ds.episodes():
        ref = peer[int(ep.meta["source_episode"])]
        seg = ep.read()
        assert_same(seg.obs, ref["state"])
        assert_same(seg.next_obs, ref["next_state"])
        assert_same(seg.action, ref["action"])
        assert_same(seg.reward, ref["reward"])
    assert ds.info["source"]["roles"]["next_observations"] == {"state": "next_state"}


def test_memmap_replay_explicit_roles(replay_folders, tmp_path, capsys):
    args = ["--observations", "state", "--extras", "image", "--terminated", "done", "--quiet"]
    assert cli.main(["import", "memmap-replay", str(replay_folders / "plain"), str(tmp_path / "ds"), *args]) == 0
    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert [f.key for f in ds.schema.role_fields("observation")] == ["observation/state"]
    assert ds.schema["extra/image"].role == "extra"
    assert ds.info["source"]["roles"]["terminated"] == "done"
    assert cli.main(["import", "minari", "any", str(tmp_path / "x"), "--lenient"]) == 2
    assert "do not apply to minari" in capsys.readouterr().err
    with pytest.raises(el.ValidationError, match="nope"):
        el.importers.memmap_replay.load(str(replay_folders / "plain"), observations=["nope"])


# ---------------------------------------------------------------- episodata (real package)


@pytest.fixture(scope="module")
def episodata_path(tmp_path_factory):
    import episodata

    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("episodata") / "ds"

    def episode(n, terminated):
        return {
            "initial_observation": {
                "camera": rng.integers(0, 256, (3, 24, 24), dtype=np.uint8),
                "state": rng.normal(size=4).astype(np.float32),
            },
            "observations": {
                "camera": rng.integers(0, 256, (n, 3, 24, 24), dtype=np.uint8),
                "state": rng.normal(size=(n, 4)).astype(np.float32),
            },
            "actions": {"move": rng.normal(size=(n, 2)).astype(np.float32), "grip": rng.integers(0, 2, n)},
            "rewards": rng.normal(size=n).astype(np.float32),
            "initial_info": {"success": np.array(False)},
            "infos": {"success": rng.integers(0, 2, n).astype(bool)},
            "terminated": terminated,
            "truncated": not terminated,
        }

    ds = episodata.Dataset.from_episodes([episode(int(rng.integers(1, 20)), k % 2 == 0) for k in range(5)], path=path)
    ds.new_episode({"camera": np.zeros((3, 24, 24), np.uint8), "state": np.zeros(4, np.float32)})  # ongoing: skipped
    ds.flush()
    return path


def test_episodata_import_matches_episodata_reader(episodata_path, tmp_path):
    import episodata

    assert cli.main(["import", "episodata", str(episodata_path), str(tmp_path / "ds")]) == 0
    ds = el.Dataset.open(str(tmp_path / "ds"))
    src = episodata.Dataset.open(str(episodata_path))
    finished = [ep for ep in src.episodes() if not ep.ongoing]
    assert len(ds) == len(finished) == 5 < src.num_episodes
    for ep, ref_ep in zip(ds.episodes(), finished, strict=True):
        ref = ref_ep.read()
        seg = ep.read()
        for k in ("camera", "state"):
            assert_same(seg.all_obs[k], ref.all_observations[k])
        for k in ("move", "grip"):
            assert_same(seg.action[k], ref.action[k])
        assert_same(seg.reward, ref.reward)
        assert_same(seg.data["extra/success"], ref.next_info["success"])
        assert_same(seg.terminated, ref.terminated)
        assert_same(seg.truncated, ref.truncated)
        assert ep.meta["source_episode"] == ref_ep.id
    assert ds.schema["observation/camera"].layout == "CHW"


def test_unknown_format():
    with pytest.raises(ValueError, match="known"):
        import_dataset("rlds", "x", None)


def test_import_quiet_off_terminal(capfd):
    import_dataset("d4rl", make_d4rl(np.random.default_rng(4)), None)
    assert capfd.readouterr().err == ""
    import_dataset("d4rl", make_d4rl(np.random.default_rng(4)), None, progress=True)
    assert "import d4rl" in capfd.readouterr().err
