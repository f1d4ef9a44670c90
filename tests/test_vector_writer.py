"""The vector writer records each env exactly as a sequential run would (Gymnasium 1.x autoreset)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import episodelake as el


def sequential_episodes(seed: int, actions: list[int]) -> list[dict]:
    """Ground truth: one env stepped by hand with the actions that env received."""
    env = gym.make("CartPole-v1", max_episode_steps=60)
    obs, _ = env.reset(seed=seed)
    episodes, cur = [], {"obs": [obs], "act": [], "rew": []}
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        cur["obs"].append(obs)
        cur["act"].append(a)
        cur["rew"].append(r)
        if term or trunc:
            episodes.append({**cur, "terminated": term, "truncated": trunc})
            obs, _ = env.reset()
            cur = {"obs": [obs], "act": [], "rew": []}
    return episodes


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_writer_matches_sequential_runs(mode):
    n, seeds, steps = 3, [11, 22, 33], 400
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=60)] * n, autoreset_mode=mode)
    schema = el.schema_from_gym_spaces(
        venv.single_observation_space, venv.single_action_space, meta=[el.FieldSpec("env", (), "int64", role="meta")]
    )
    ds = el.Dataset.create(schema)
    obs, _ = venv.reset(seed=seeds)
    writer = ds.vector_writer(obs, n, autoreset_mode=mode, meta=lambda i: {"env": i})
    rng = np.random.default_rng(0)
    taken: list[list[int]] = [[] for _ in range(n)]
    was_done = np.zeros(n, bool)
    for _ in range(steps):
        actions = rng.integers(0, 2, n)
        for i in range(n):
            # In next_step mode the step after an episode end is a reset: its action is ignored.
            if not (mode == AutoresetMode.NEXT_STEP and was_done[i]):
                taken[i].append(int(actions[i]))
        obs, rew, term, trunc, info = venv.step(actions)
        writer.add_steps(obs, actions, rew, term, trunc, info)
        was_done = term | trunc
    writer.close()
    ds.flush()
    total = 0
    for i in range(n):
        # a sequential run with the same actions (actions after the last finished episode don't matter)
        want = sequential_episodes(seeds[i], taken[i])
        got = [e for e in ds.episodes() if e.meta["env"] == i]
        assert len(got) == len(want) > 2
        for g, w in zip(got, want, strict=True):
            seg = g.read()
            np.testing.assert_array_equal(seg.all_obs, np.array(w["obs"], np.float32))
            np.testing.assert_array_equal(seg.action, np.array(w["act"]))
            np.testing.assert_array_equal(seg.reward, np.array(w["rew"], np.float32))
            assert (g.terminated, g.truncated) == (w["terminated"], w["truncated"])
        total += len(got)
    assert total == len(ds)


def test_vector_writer_rejects_bad_row_and_changes_nothing():
    schema = el.DatasetSchema(
        [el.FieldSpec("observation", (2,)), el.FieldSpec("action", (), "int64", role="action"),
         el.FieldSpec("reward", (), role="reward")]
    )  # fmt: skip
    ds = el.Dataset.create(schema)
    w = ds.vector_writer(np.zeros((2, 2), np.float32), 2)
    w.add_steps(np.ones((2, 2), np.float32), [0, 1], [1.0, 1.0], [False, False], [False, False])
    bad_obs = np.ones((2, 2), np.float32)
    bad_obs[1, 0] = np.nan
    with pytest.raises(el.ValidationError, match="env 1"):
        w.add_steps(bad_obs, [0, 1.5], [1.0, 1.0], [False, False], [False, False])
    assert [x.length for x in w.writers] == [1, 1]
    w.add_steps(np.full((2, 2), 2, np.float32), [0, 1], [1.0, 2.0], [True, False], [False, True])
    ds.flush()
    assert len(ds) == 2
    np.testing.assert_array_equal(ds.episode(0).read().all_obs[:, 0], [0, 1, 2])
