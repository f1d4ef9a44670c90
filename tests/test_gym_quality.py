"""Recorders meeting a frozen camera (issue 39, item 8): constraints' ``on_fail`` and the recorders' ``on_reject``.

A real Gymnasium env (CartPole) behind :class:`FrozenCamera`, a wrapper that
holds the observation still for a few steps in chosen episodes, the way a
stalled camera driver does; ``max_repeat=3`` on the observation trips on
exactly those episodes, at a step known from the wrapper's settings.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

import episodelake as el
from episodelake.integrations.gymnasium import RecordEpisodes, RecordVectorEpisodes

START, HELD = 2, 5  # frozen: observation rows START + 1 .. START + HELD repeat row START
MAX_REPEAT = 3
FAILING_STEP = START + MAX_REPEAT  # the (MAX_REPEAT + 1)-th identical row
EPISODES = 6
FROZEN = {1, 4}
STEPS = 20


class FrozenCamera(gym.Wrapper):
    """Repeats the observation of step ``START`` for ``HELD`` more steps in the episodes ``frozen`` (0-based)."""

    def __init__(self, env: gym.Env, frozen: set[int]) -> None:
        super().__init__(env)
        self.frozen = frozen
        self.episode = -1
        self.t = 0
        self.held = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.episode += 1
        self.t = 0
        self.held = obs
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        if self.episode in self.frozen and START < self.t <= START + HELD:
            obs = self.held.copy()
        else:
            self.held = obs
        return obs, reward, terminated, truncated, info


def cartpole(frozen: set[int] = FROZEN) -> gym.Env:
    return FrozenCamera(gym.make("CartPole-v1", max_episode_steps=STEPS), frozen)


def frozen_camera(on_fail: str = "reject") -> dict:
    return {"field_options": {"observation": {"max_repeat": MAX_REPEAT, "on_fail": on_fail}}}


def run(rec: gym.Env, episodes: int = EPISODES) -> int:
    """Run ``episodes`` episodes (alternating actions keep the pole up for all ``STEPS``); the steps taken."""
    taken = 0
    for e in range(episodes):
        rec.reset(seed=e)
        done = False
        while not done:
            _, _, terminated, truncated, _ = rec.step(taken % 2)
            taken += 1
            done = terminated or truncated
    return taken


def test_quarantine_lets_the_loop_finish_and_holds_the_frozen_episodes_back(tmp_path):
    rec = RecordEpisodes(cartpole(), str(tmp_path / "ds"), **frozen_camera("quarantine"))
    run(rec)
    rec.close()
    ds = el.Dataset.open(str(tmp_path / "ds"))
    held = ds.quality.quarantine()
    assert sorted(int(e.meta["seed"]) for e in held.episodes()) == sorted(FROZEN)
    assert sorted(int(e.meta["seed"]) for e in ds.episodes()) == sorted(set(range(EPISODES)) - FROZEN)
    assert held.sql("SELECT DISTINCT checks_failed FROM episodes").fetchall() == [(["observation: max_repeat"],)]
    assert rec.rejected == []
    obs = held.episode(0).read().observation
    assert np.array_equal(obs[START + 1], obs[START])  # stored as recorded


def test_skip_drops_rejected_episodes_counts_them_and_warns_on_close():
    rec = RecordEpisodes(cartpole(), None, on_reject="skip", **frozen_camera())
    run(rec)
    assert [(e.check, e.step) for e in rec.rejected] == [("observation: max_repeat", FAILING_STEP)] * len(FROZEN)
    with pytest.warns(UserWarning, match=r"skipped 2 episode\(s\).*2 x 'observation: max_repeat'"):
        rec.close()
    assert sorted(int(e.meta["seed"]) for e in rec.dataset.episodes()) == sorted(set(range(EPISODES)) - FROZEN)
    assert len(rec.dataset.quality.quarantine()) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec.close()  # reported once


def test_raise_stops_the_step_that_ends_the_episode_naming_field_and_step():
    rec = RecordEpisodes(cartpole(frozen={0}), None, **frozen_camera())
    rec.reset(seed=0)
    with pytest.raises(
        el.QualityError, match=rf"field 'observation' fails max_repeat=3 at step {FAILING_STEP}"
    ) as info:
        for t in range(STEPS):
            rec.step(t % 2)
    assert (info.value.check, info.value.step) == ("observation: max_repeat", FAILING_STEP)
    assert "array(" not in str(info.value) and "'seed': 0" in str(info.value)  # plain values
    run(rec, 1)  # the recorder goes on with the next episode
    rec.close()
    assert len(rec.dataset) == 1 and rec.rejected == []


def test_vector_recorder_skips_every_rejected_env():
    venv = SyncVectorEnv([lambda: cartpole(frozen={0, 2}), lambda: cartpole(frozen={0})])
    rec = RecordVectorEpisodes(venv, None, on_reject="skip", **frozen_camera())
    rec.reset(seed=0)
    for t in range(3 * (STEPS + 1)):  # next-step autoreset: 3 episodes per env (each 20 steps, then its reset row)
        rec.step(np.array([t % 2, t % 2]))
    assert sorted(str(e).split(",")[0] for e in rec.rejected) == ["env 0", "env 0", "env 1"]
    assert {(e.check, e.step) for e in rec.rejected} == {("observation: max_repeat", FAILING_STEP)}
    with pytest.warns(UserWarning, match=r"RecordVectorEpisodes skipped 3 episode\(s\)"):
        rec.close()
    kept = sorted((int(e.meta["env_index"]), e.length) for e in rec.dataset.episodes())
    assert kept == [(0, STEPS), (1, STEPS), (1, STEPS)]


def test_vector_recorder_raises_after_recording_every_env():
    venv = SyncVectorEnv([lambda: cartpole(frozen={0}), lambda: cartpole(frozen=set())])
    rec = RecordVectorEpisodes(venv, None, **frozen_camera())
    rec.reset(seed=0)
    with pytest.raises(el.QualityError, match=rf"env 0, .*fails max_repeat=3 at step {FAILING_STEP}"):
        for t in range(STEPS):
            rec.step(np.array([t % 2, t % 2]))
    rec.close()
    assert [int(e.meta["env_index"]) for e in rec.dataset.episodes()] == [1]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"on_reject": "ignore"}, el.ArgumentError, r"on_reject must be one of \('raise', 'skip'\)"),
        ({"checks": [el.Check("moving", '"observation/speed" > 0')]}, el.QueryError, r"moving"),
        ({"checks": el.Check("one", "length > 0")}, el.ArgumentError, r"checks must be an iterable of Check"),
        ({"checks": ["length > 0"]}, el.ArgumentError, r"checks must be Check objects"),
        ({"capacity": -5}, el.ArgumentError, r"capacity"),
        ({"commit_every": 3}, el.ArgumentError, r"unknown recorder option\(s\) \['commit_every'\]"),
    ],
)
@pytest.mark.parametrize("waits", [False, True], ids=["created-now", "created-at-first-step"])
def test_bad_options_fail_when_the_recorder_is_built(tmp_path, options, error, message, waits):
    """Also when creation waits for the first step (an undeclared info key): nothing is created."""
    path = tmp_path / "ds"
    info_keys = ["probe"] if waits else []
    with pytest.raises(error, match=message):
        RecordEpisodes(cartpole(), str(path), info_keys=info_keys, **options)
    assert not path.exists()


def test_a_check_on_an_undeclared_field_binds_at_the_first_step():
    """A check naming an info key whose type the first step gives is bound then, and works."""
    probe = ProbeInfo(cartpole(frozen=set()))
    rec = RecordEpisodes(probe, None, info_keys=["probe"], checks=[el.Check("probed", '"extra/probe" >= 0', "step")])
    run(rec, 2)
    rec.close()
    assert len(rec.dataset) == 2 and rec.dataset.quality.list()[0].name == "probed"


class ProbeInfo(gym.Wrapper):
    """Adds ``info["probe"]`` (the step number) to every step."""

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, truncated, {**info, "probe": self.t}
