"""Record MuJoCo InvertedPendulum with a rendered camera through quality gates; exit without flush().

usage: record_quality.py PATH TRUTH.json [--episodes N] [--commit-episodes K]

The camera of every third episode is frozen by hand after its second step
(``max_repeat=3`` rejects it when it ends); every other episode claims
``success`` in its last info, and the ``success_pays`` check quarantines a
success whose return is below 15. TRUTH.json gets what this script's own loop
saw: per episode its number, length, return, claimed success, whether its
camera was frozen, and whether the recorder raised QualityError for it.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym
import numpy as np

import episodelake as el
from episodelake.integrations.gymnasium import RecordEpisodes, dataset_for_env

p = argparse.ArgumentParser()
p.add_argument("path")
p.add_argument("truth")
p.add_argument("--episodes", type=int, default=12)
p.add_argument("--commit-episodes", type=int, default=4)
args = p.parse_args()


class Camera(gym.Wrapper):
    """Observations {"state", "camera"} (a 32x32 render); ``freeze`` repeats the camera's frame from step 2 on;
    the last info claims ``is_success`` when ``claim``; episodes are truncated at ``limit`` steps."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        camera = gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)
        self.observation_space = gym.spaces.Dict({"state": env.observation_space, "camera": camera})
        self.freeze, self.claim, self.limit, self.t, self.frame = False, False, 0, 0, None

    def _obs(self, state):
        frame = self.env.render()
        if self.freeze and self.t >= 2:
            frame = self.frame
        self.frame = frame
        return {"state": state, "camera": frame}

    def reset(self, **kw):
        state, info = self.env.reset(**kw)
        self.t = 0
        return self._obs(state), info

    def step(self, action):
        state, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        truncated = truncated or self.t >= self.limit
        info = {**info, "is_success": self.claim and (terminated or truncated)}
        return self._obs(state), reward, terminated, truncated, info


env = Camera(gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=32, height=32))
ds = dataset_for_env(
    env,
    args.path,
    meta_fields=[el.FieldSpec("n", (), "int64", role="meta"), el.FieldSpec("success", (), "bool", role="meta")],
    field_options={"observation/camera": {"max_repeat": 3}},
    checks=[el.Check("success_pays", 'NOT success OR "return" >= 15', on_fail="quarantine")],
    commit_episodes=args.commit_episodes,
)
rec = RecordEpisodes(env, ds, meta=lambda ctx: {"n": ctx["seed"]}, outcome={"success": "is_success"})
rng = np.random.default_rng(0)
truth = []
for n in range(args.episodes):
    env.freeze, env.claim, env.limit = n % 3 == 2, n % 2 == 0, int(rng.choice([6, 30]))
    rec.reset(seed=n)
    length, ret, raised = 0, 0.0, False
    while True:
        try:
            _, reward, terminated, truncated, _ = rec.step(np.zeros(1, np.float32))
        except el.QualityError:  # the gate refused the episode at its last step (the env ended it)
            raised, terminated, reward = True, True, 0.0
        length += 1
        ret += float(reward)
        if terminated or truncated:
            break
    seen = {"length": length, "return": ret, "success": env.claim, "frozen": env.freeze, "raised": raised}
    truth.append({"n": n, **seen})
with open(args.truth, "w") as fh:
    json.dump(truth, fh)
print(json.dumps({"episodes": len(truth)}))
# no flush(), no close(): the pending episodes are committed at exit
