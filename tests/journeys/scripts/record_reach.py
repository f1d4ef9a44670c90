"""Record a vector Gymnasium env with image observations, outcome ``success`` from info; exit without flush().

usage: record_reach.py PATH TRUTH.json [--mode next_step|same_step] [--options JSON] [--compression zstd]
                       [--num-envs N] [--steps S] [--seed SEED] [--commit-episodes K]

TRUTH.json gets what this script's own loop saw, independently of the recorder:
per finished episode its env index, length, return and success.
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from reach_env import ENV_ID

from episodelake.integrations.gymnasium import RecordVectorEpisodes

p = argparse.ArgumentParser()
p.add_argument("path")
p.add_argument("truth")
p.add_argument("--mode", default="next_step", choices=["next_step", "same_step"])
p.add_argument("--options", default=None)
p.add_argument("--compression", default=None)
p.add_argument("--num-envs", type=int, default=3)
p.add_argument("--steps", type=int, default=150)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--commit-episodes", type=int, default=64)
args = p.parse_args()

mode = AutoresetMode.NEXT_STEP if args.mode == "next_step" else AutoresetMode.SAME_STEP
venv = SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(args.num_envs)], autoreset_mode=mode)
env = RecordVectorEpisodes(
    venv,
    args.path,
    info_keys=["reward_dist"],
    outcome={"success": "is_success"},
    compression=args.compression,
    storage_options=json.loads(args.options) if args.options else None,
    commit_episodes=args.commit_episodes,
)
n = args.num_envs
truth, length, ret = [], np.zeros(n, int), np.zeros(n)
resetting = np.zeros(n, bool)  # next_step: the row after an episode ends is its reset
rng = np.random.default_rng(args.seed)
obs, infos = env.reset(seed=args.seed)
for _ in range(args.steps):
    obs, rewards, terminated, truncated, infos = env.step(rng.integers(0, 5, n))
    final = infos.get("final_info", {}) if args.mode == "same_step" else infos
    for i in range(n):
        if resetting[i]:
            resetting[i] = False
            continue
        length[i] += 1
        ret[i] += rewards[i]
        if terminated[i] or truncated[i]:
            success = bool(final["is_success"][i])
            truth.append({"env_index": i, "length": int(length[i]), "return": float(ret[i]), "success": success})
            length[i], ret[i] = 0, 0.0
            resetting[i] = args.mode == "next_step"

with open(args.truth, "w") as f:
    json.dump(truth, f)
print(json.dumps({"finished": len(truth), "successes": sum(t["success"] for t in truth)}))
# No env.close() and no flush(): finished episodes must be committed at interpreter exit.
