"""Recording real Gymnasium envs, checked against a hand-stepped twin env (same seeds, same actions)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import episodelake as el
from episodelake.integrations.gymnasium import (
    RecordEpisodes,
    RecordVectorEpisodes,
    dataset_for_env,
    schema_for_env,
    space_from_json,
    space_to_json,
)

from .journeys.scripts.reach_env import ENV_ID as REACH  # importing registers the env


class DictMultiDiscreteEnv(gym.Env):
    """Dict observations (nested, with a >1 KiB image stored as a tensor) and MultiDiscrete actions."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (24, 24, 3), np.uint8),
                "sensors": gym.spaces.Dict({"imu": gym.spaces.Box(-1, 1, (3,), np.float32)}),
                "count": gym.spaces.Discrete(100),
            }
        )
        self.action_space = gym.spaces.MultiDiscrete([3, 5])

    def _obs(self) -> dict:
        return {
            "image": self.np_random.integers(0, 256, (24, 24, 3), dtype=np.uint8),
            "sensors": {"imu": self.np_random.uniform(-1, 1, 3).astype(np.float32)},
            "count": np.int64(self.t),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.horizon = int(self.np_random.integers(3, 12))
        return self._obs(), {"t": self.t}

    def step(self, action):
        self.t += 1
        reward = float(action[0]) - 0.5 * float(action[1]) + float(self.np_random.normal())
        terminated = self.t >= self.horizon and action[0] == 0
        truncated = self.t >= self.horizon + 3  # may coincide with terminated, as with TimeLimit
        return self._obs(), reward, bool(terminated), bool(truncated), {"t": self.t}


gym.register("DictMultiDiscrete-v0", entry_point=f"{__name__}:DictMultiDiscreteEnv")

ENVS = ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1", "DictMultiDiscrete-v0"]
MAX_STEPS = {"CartPole-v1": None, "Pendulum-v1": 30, "FrozenLake-v1": None, "DictMultiDiscrete-v0": None}


def flat(value, prefix=""):
    """Nested observation -> {path: array} (the reference's own flattening)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flat(v, f"{prefix}{k}/"))
        return out
    return {prefix[:-1]: np.asarray(value)}


def make(env_id):
    kw = {"max_episode_steps": MAX_STEPS[env_id]} if MAX_STEPS[env_id] else {}
    return gym.make(env_id, **kw)


def run_reference(env_id, seeds, actions_per_episode):
    """Step a fresh env by hand: list of (obs rows, actions, rewards, terminated, truncated) per episode."""
    env = make(env_id)
    episodes = []
    for seed, actions in zip(seeds, actions_per_episode, strict=True):
        obs, _ = env.reset(seed=seed)
        rows, acts, rews = [flat(obs)], [], []
        for a in actions:
            obs, r, te, tr, _ = env.step(a)
            rows.append(flat(obs))
            acts.append(flat(a))
            rews.append(r)
            if te or tr:
                break
        episodes.append((rows, acts, rews, te, tr))
    return episodes


def action_plan(env_id, n_episodes, seed=0):
    space = make(env_id).action_space
    space.seed(seed)
    return [[space.sample() for _ in range(600)] for _ in range(n_episodes)]


def stacked(rows, key):
    return np.stack([r[key] for r in rows])


def check_episode(ref_ep, seg, schema):
    rows, acts, rews, te, tr = ref_ep
    assert len(seg) == len(acts)
    for f in schema.role_fields("observation"):
        name = f.name if f.name != "observation" else ""
        got = seg.all_obs if schema.unwrapped("observation") else seg.all_obs[f.name]
        np.testing.assert_array_equal(got, stacked(rows, name))
        assert got.dtype == f.np_dtype
    got_a = seg.action
    np.testing.assert_array_equal(got_a, stacked(acts, ""))
    np.testing.assert_array_equal(seg.reward, np.asarray(rews, dtype=np.float64))
    assert bool(seg.terminated[-1]) == te and bool(seg.truncated[-1]) == (tr and not te)
    assert not seg.terminated[:-1].any() and not seg.truncated[:-1].any()


def play(env, seeds, plan) -> None:
    """Run each planned episode (reset with its seed, then its actions until it ends), then close the env."""
    for seed, actions in zip(seeds, plan, strict=True):
        env.reset(seed=seed)
        for a in actions:
            _, _, te, tr, _ = env.step(a)
            if te or tr:
                break
    env.close()


@pytest.mark.parametrize("env_id", ENVS)
def test_record_episodes_matches_hand_stepped_env(env_id, tmp_path):
    seeds = [11, None, 7]
    plan = action_plan(env_id, len(seeds))
    env = RecordEpisodes(make(env_id), str(tmp_path / "ds"), meta=lambda ctx: {"seed": ctx["seed"]})
    play(env, seeds, plan)
    # the unseeded middle episode continues the env's RNG: reproduce the whole sequence in one env
    ref = run_reference(env_id, seeds, plan)

    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert len(ds) == len(seeds)
    for i, ref_ep in enumerate(ref):
        ep = ds.episode(i)
        check_episode(ref_ep, ep.read(), ds.schema)
        assert ep.meta["seed"] == seeds[i]
        assert ep.meta["env_id"] == env_id
    info = ds.info
    assert info["env_id"] == env_id
    assert space_from_json(info["observation_space"]) == make(env_id).observation_space
    assert space_from_json(info["action_space"]) == make(env_id).action_space
    assert info["env_spec"]["id"] == env_id
    if env_id != "DictMultiDiscrete-v0":
        assert info["packages"]["gymnasium"] == gym.__version__
    assert ds.maintenance.descriptor["versions"]["gymnasium"] == gym.__version__


def test_dict_env_fields_and_tensor_storage():
    ds = dataset_for_env(make("DictMultiDiscrete-v0"))
    keys = {f.key: f for f in ds.schema}
    assert keys["observation/image"].in_tensor and keys["observation/image"].layout == "HWC"
    assert keys["observation/sensors/imu"].shape == (3,)
    assert keys["action"].shape == (2,) and keys["action"].np_dtype == np.int64


def test_partial_episodes_and_static_meta():
    env = make("CartPole-v1")
    fields = [el.FieldSpec("operator", (), "str", role="meta")]
    rec = RecordEpisodes(env, None, meta={"operator": "ann"}, meta_fields=fields)
    rec.reset(seed=1)
    rec.step(0)
    rec.step(1)
    rec.reset(seed=2)  # cuts the first episode: dropped by default
    rec.step(0)
    rec.close()
    assert len(rec.dataset) == 0

    rec = RecordEpisodes(make("CartPole-v1"), None, meta={"operator": "bob"}, keep_partial=True, meta_fields=fields)
    rec.reset(seed=3)
    for a in (0, 1, 0):
        rec.step(a)
    rec.close()
    ds = rec.dataset
    assert len(ds) == 1
    ep = ds.episode(0)
    assert ep.length == 3 and not ep.terminated and not ep.truncated
    assert ep.meta == {"seed": 3, "env_id": "CartPole-v1", "operator": "bob"}


def test_step_before_reset_is_an_error():
    rec = RecordEpisodes(make("CartPole-v1"), None)
    with pytest.raises(el.EpisodeStateError, match="reset"):
        rec.step(0)


def test_existing_dataset_must_match_spaces():
    ds = dataset_for_env(make("Pendulum-v1"))
    with pytest.raises(el.SchemaError, match="observation"):
        RecordEpisodes(make("CartPole-v1"), ds)
    rec = RecordEpisodes(make("Pendulum-v1"), ds)
    assert rec.dataset is ds


def test_space_json_round_trip():
    spaces = [
        gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
        gym.spaces.Box(np.array([0, -1]), np.array([1, 5]), (2,), np.int32),
        gym.spaces.Discrete(7, start=-3),
        gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
        gym.spaces.MultiBinary([2, 2]),
        make("DictMultiDiscrete-v0").observation_space,
    ]
    for space in spaces:
        text = json.dumps(space_to_json(space), allow_nan=False)  # strict JSON: no bare Infinity
        assert space_from_json(json.loads(text)) == space


# ---------------------------------------------------------------- vector envs


def vector_reference(env_id, num_envs, seed, actions, mode):
    """Per env i: episodes of a single env seeded seed + i, replaying the vector run's actions.

    NEXT_STEP: the step after an episode ends resets that env (its action is ignored);
    SAME_STEP: the env resets within the step that ended the episode.
    """
    out = []
    for i in range(num_envs):
        env = make(env_id)
        obs, _ = env.reset(seed=seed + i)
        episodes, cur = [], {"rows": [flat(obs)], "acts": [], "rews": []}
        pending_reset = False
        for t in range(len(actions)):
            a = actions[t][i]
            if pending_reset:
                obs, _ = env.reset()
                cur = {"rows": [flat(obs)], "acts": [], "rews": []}
                pending_reset = False
                continue
            obs, r, te, tr, _ = env.step(a)
            cur["rows"].append(flat(obs))
            cur["acts"].append(flat(a))
            cur["rews"].append(r)
            if te or tr:
                episodes.append((cur["rows"], cur["acts"], cur["rews"], te, tr))
                if mode == AutoresetMode.NEXT_STEP:
                    pending_reset = True
                else:
                    obs, _ = env.reset()
                    cur = {"rows": [flat(obs)], "acts": [], "rews": []}
        out.append(episodes)
    return out


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "DictMultiDiscrete-v0"])
def test_vector_recorder_matches_sequential_runs(env_id, mode):
    num_envs, steps, seed = 3, 120, 5
    venv = SyncVectorEnv([lambda: make(env_id) for _ in range(num_envs)], autoreset_mode=mode)
    rec = RecordVectorEpisodes(venv, None)
    venv.action_space.seed(3)
    actions = [venv.action_space.sample() for _ in range(steps)]
    rec.reset(seed=seed)
    for a in actions:
        rec.step(a)
    rec.close()
    ds = rec.dataset
    ref = vector_reference(env_id, num_envs, seed, actions, mode)
    assert len(ds) == sum(len(r) for r in ref)
    for i in range(num_envs):
        mine = [ep for ep in ds.episodes() if ep.meta["env_index"] == i]
        assert len(mine) == len(ref[i])
        for k, (ep, ref_ep) in enumerate(zip(mine, ref[i], strict=True)):
            check_episode(ref_ep, ep.read(), ds.schema)
            assert ep.meta["seed"] == (seed + i if k == 0 else None)
            assert ep.meta["env_id"] == env_id
    assert ds.info["num_envs"] == num_envs


def test_vector_recorder_rejects_disabled_autoreset():
    venv = SyncVectorEnv([lambda: make("CartPole-v1")], autoreset_mode=AutoresetMode.DISABLED)
    with pytest.raises(el.ValidationError, match="autoreset"):
        RecordVectorEpisodes(venv, None)


# ---------------------------------------------------------------- info fields and outcomes


def reach_plain_loop(seeds, actions):
    """Ground truth by a plain Gymnasium loop: per episode (obs rows, infos, success at the last step)."""
    env = gym.make(REACH)
    out = []
    for seed, plan in zip(seeds, actions, strict=True):
        obs, _ = env.reset(seed=seed)
        rows, infos = [obs], []
        for a in plan:
            obs, _, te, tr, info = env.step(a)
            rows.append(obs)
            infos.append(info)
            if te or tr:
                break
        out.append((np.stack(rows), infos))
    return out


def check_reach_episode(ep, rows, infos):
    seg = ep.read()
    np.testing.assert_array_equal(seg.all_obs, rows)
    np.testing.assert_array_equal(seg.extra["reward_dist"], [i["reward_dist"] for i in infos])
    np.testing.assert_array_equal(seg.extra["pos"], np.stack([i["pos"] for i in infos]))
    assert ep.meta["success"] == infos[-1]["is_success"]


@pytest.mark.parametrize("declared", [False, True])
def test_record_info_keys_and_outcome_match_plain_loop(declared, tmp_path):
    seeds = list(range(12))
    plan = [[int(a) for a in np.random.default_rng(s).integers(0, 5, 20)] for s in seeds]
    declarations = {}
    if declared:
        declarations["schema"] = schema_for_env(
            gym.make(REACH),
            extra_fields=[
                el.FieldSpec("reward_dist", (), "float64", role="extra"),
                el.FieldSpec("pos", (2,), "float32", role="extra"),
            ],
            meta_fields=[el.FieldSpec("success", (), "bool", role="meta")],
        )
    rec = RecordEpisodes(
        gym.make(REACH),
        str(tmp_path / "ds"),
        info_keys=["reward_dist", "pos"],
        outcome={"success": "is_success"},
        compression="zstd",
        **declarations,
    )
    if declared:  # every field is declared: the dataset exists before the first step
        assert rec.dataset.schema["success"].dtype == "bool"
    else:  # the types come from the first step's info: the dataset is created then
        with pytest.raises(el.EpisodeStateError, match="first step"):
            rec.dataset  # noqa: B018
    play(rec, seeds, plan)
    ref = reach_plain_loop(seeds, plan)
    ds = el.Dataset.open(str(tmp_path / "ds"))
    successes = [infos[-1]["is_success"] for _, infos in ref]
    assert 0 < sum(successes) < len(seeds)  # both outcomes occur
    assert len(ds) == len(seeds)
    for i, (rows, infos) in enumerate(ref):
        check_reach_episode(ds.episode(i), rows, infos)
        assert ds.episode(i).meta["seed"] == seeds[i] and ds.episode(i).meta["env_id"] == REACH
    assert sorted(ds.where("success").episode_ids) == sorted(
        ds.episode(i).episode_id for i, s in enumerate(successes) if s
    )
    schema = ds.schema
    assert (schema["extra/reward_dist"].dtype, schema["extra/reward_dist"].shape) == ("float64", ())
    assert (schema["extra/pos"].dtype, schema["extra/pos"].shape) == ("float32", (2,))
    assert schema["success"].dtype == "bool" and schema["observation"].compression == "zstd"
    zarr = json.loads(next((tmp_path / "ds").rglob("observation/zarr.json")).read_text())
    assert "zstd" in json.dumps(zarr["codecs"])


def vector_reach_reference(num_envs, seed, actions, mode):
    """Per env i: (obs rows, step infos) of each episode, from a plain single-env loop replaying the actions."""
    out = []
    for i in range(num_envs):
        env = gym.make(REACH)
        obs, _ = env.reset(seed=seed + i)
        episodes, rows, infos, pending = [], [obs], [], False
        for t in range(len(actions)):
            if pending:  # next_step: this row resets env i
                obs, _ = env.reset()
                rows, infos, pending = [obs], [], False
                continue
            obs, _, te, tr, info = env.step(actions[t][i])
            rows.append(obs)
            infos.append(info)
            if te or tr:
                episodes.append((np.stack(rows), infos))
                if mode == AutoresetMode.NEXT_STEP:
                    pending = True
                else:
                    obs, _ = env.reset()
                    rows, infos = [obs], []
        out.append(episodes)
    return out


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_outcomes_match_plain_loop(mode):
    num_envs, steps, seed = 3, 90, 100
    venv = SyncVectorEnv([lambda: gym.make(REACH) for _ in range(num_envs)], autoreset_mode=mode)
    rec = RecordVectorEpisodes(
        venv, None, info_keys=["reward_dist", "pos"], outcome={"success": "is_success"}, commit_episodes=4
    )
    actions = np.random.default_rng(7).integers(0, 5, (steps, num_envs))
    rec.reset(seed=seed)
    for a in actions:
        rec.step(a)
    rec.close()
    ds = rec.dataset
    ref = vector_reach_reference(num_envs, seed, actions, mode)
    assert len(ds) == sum(len(r) for r in ref)
    assert 0 < len(ds.where("success")) < len(ds)
    for i in range(num_envs):
        mine = [ep for ep in ds.episodes() if ep.meta["env_index"] == i]
        assert len(mine) == len(ref[i])
        for ep, (rows, infos) in zip(mine, ref[i], strict=True):
            check_reach_episode(ep, rows, infos)


def test_outcome_of_kept_partial_episode_comes_from_its_last_step():
    fields = [el.FieldSpec("success", (), "bool", role="meta"), el.FieldSpec("dist", (), "float64", role="meta")]
    rec = RecordEpisodes(
        gym.make(REACH),
        None,
        keep_partial=True,
        outcome={"success": "is_success", "dist": "reward_dist", "missing": "no_such_key"},
        meta_fields=[*fields, el.FieldSpec("missing", (), "int32", role="meta")],
    )
    rec.reset(seed=3)
    for a in (0, 0):
        _, _, _, _, info = rec.step(a)
    rec.close()  # cuts the episode: kept, with the outcome of its last step
    ep = rec.dataset.episode(0)
    assert ep.length == 2 and not ep.terminated and not ep.truncated
    assert ep.meta["success"] is not None and not ep.meta["success"]
    assert ep.meta["dist"] == info["reward_dist"]
    assert ep.meta["missing"] is None  # an info key absent at the last step gives null


def test_missing_info_key_is_a_clear_error():
    rec = RecordEpisodes(gym.make(REACH), None, info_keys=["reward_dist", "nope"])
    rec.reset(seed=0)
    with pytest.raises(el.ValidationError, match=r"step 0: info has no \['nope'\]"):
        rec.step(0)
    rec = RecordEpisodes(gym.make(REACH), None, outcome={"success": "nope"})
    rec.reset(seed=0)
    with pytest.raises(el.SchemaError, match=r"outcome 'success'.*'nope'.*declare"):
        rec.step(0)


def test_custom_schema_keeps_seed_and_env_id(tmp_path):
    env = gym.make(REACH)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (3, 32, 32), "uint8", layout="CHW", compression="zstd"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )
    rec = RecordEpisodes(env, str(tmp_path / "ds"), schema=schema, meta={"task": "reach"}, keep_partial=True)
    rec.reset(seed=42)
    rec.step(0)
    rec.close()
    ep = el.Dataset.open(str(tmp_path / "ds")).episode(0)
    assert ep.meta == {"task": "reach", "seed": 42, "env_id": REACH}
    assert rec.dataset.schema["reward"].dtype == "float32"  # the passed schema's, not the default float64

    bad = el.DatasetSchema([*schema, el.FieldSpec("seed", (), "str", role="meta")])
    with pytest.raises(el.SchemaError, match="'seed' is str"):
        RecordEpisodes(env, None, schema=bad)
    # A Dataset passed in is recorded into as it is: only the recorder meta it declares is filled in.
    vrec = RecordVectorEpisodes(SyncVectorEnv([lambda: gym.make(REACH)]), rec.dataset, meta={"task": "v"})
    vrec.reset(seed=7)
    vrec.step(np.array([0]))
    vrec.close()
    plain = el.Dataset.create(schema)
    prec = RecordEpisodes(env, plain, meta={"task": "plain"}, keep_partial=True)
    prec.reset(seed=3)
    prec.step(0)
    prec.close()
    assert plain.episode(0).meta == {"task": "plain"}
    with pytest.raises(el.SchemaError, match="no field for info key"):
        RecordEpisodes(env, rec.dataset, info_keys=["pos"])


def test_field_options_and_compression():
    env = gym.make(REACH)
    rec = RecordEpisodes(
        env,
        None,
        compression="zstd",
        field_options={"observation": {"chunk_rows": 8}, "reward": {"finite": True}},
    )
    obs = rec.dataset.schema["observation"]
    assert (obs.chunk_rows, obs.compression, rec.dataset.schema["reward"].finite) == (8, "zstd", True)
    assert rec.dataset.schema["action"].compression is None  # a table field: compression is for tensors
    raw = RecordEpisodes(env, None, field_options={"observation": {"compression": None}}, compression="zstd")
    assert raw.dataset.schema["observation"].compression is None  # per-field options win
    with pytest.raises(el.SchemaError, match=r"unknown field\(s\) \['observation/rgb'\]"):
        RecordEpisodes(env, None, field_options={"observation/rgb": {"chunk_rows": 8}})
    with pytest.raises(el.SchemaError, match="field_options\\['observation'\\]"):
        RecordEpisodes(env, None, field_options={"observation": {"chunk": 8}})
    with pytest.raises(el.SchemaError, match="compression must be"):
        RecordEpisodes(env, None, compression="gzip")
    with pytest.raises(TypeError, match="compression"):
        RecordEpisodes(env, rec.dataset, compression="zstd")


def test_existing_path_fails_when_the_recorder_is_built(tmp_path):
    path = str(tmp_path / "ds")
    dataset_for_env(gym.make(REACH), path)
    with pytest.raises(FileExistsError, match="overwrite=True"):  # before any step, though creation waits for one
        RecordEpisodes(gym.make(REACH), path, info_keys=["pos"])
    rec = RecordEpisodes(gym.make(REACH), path, info_keys=["pos"], overwrite=True)
    rec.reset(seed=0)
    rec.step(1)
    assert rec.dataset.schema["extra/pos"].shape == (2,)


def test_vector_kept_partial_episodes_get_their_last_step_outcome():
    venv = SyncVectorEnv([lambda: gym.make(REACH) for _ in range(2)], autoreset_mode=AutoresetMode.SAME_STEP)
    rec = RecordVectorEpisodes(venv, None, keep_partial=True, outcome={"dist": "reward_dist"})
    rec.reset(seed=7)
    for _ in range(3):
        _, _, term, _, infos = rec.step(np.array([0, 0]))  # standing still: no episode ends
        assert not term.any()
    rec.close()  # cuts both episodes: kept, each with the outcome of its own last step
    eps = {int(ep.meta["env_index"]): ep for ep in rec.dataset.episodes()}
    assert [eps[i].length for i in range(2)] == [3, 3]
    assert [eps[i].meta["dist"] for i in range(2)] == list(infos["reward_dist"])
    assert len(set(infos["reward_dist"])) == 2  # the envs differ, so a mix-up would show
