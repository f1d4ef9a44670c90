"""A tiny Gymnasium env with image observations whose info reports success (used by the journeys and tests).

A point moves on a 4x4 grid towards a goal. Observations are uint8[3, 32, 32]
images (noise, the point in channel 0, the goal in channel 1). ``info`` has
``is_success`` (bool), ``reward_dist`` (float) and ``pos`` (float32[2]) at every
step; episodes end terminated on success or truncated after 20 steps.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "ReachImage-v0"
MOVES = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)])


class ReachImageEnv(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)
        self.action_space = gym.spaces.Discrete(5)

    def _obs(self) -> np.ndarray:
        img = self.np_random.integers(0, 64, (3, 32, 32), dtype=np.uint8)
        y, x = self.pos * 8
        img[0, y : y + 8, x : x + 8] = 255
        y, x = self.goal * 8
        img[1, y : y + 8, x : x + 8] = 255
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.integers(0, 4, 2)
        self.goal = self.np_random.integers(0, 4, 2)
        return self._obs(), {"goal": self.goal.astype(np.float32)}

    def step(self, action):
        self.pos = np.clip(self.pos + MOVES[int(action)], 0, 3)
        dist = float(np.abs(self.pos - self.goal).sum())
        success = dist == 0
        info = {"is_success": bool(success), "reward_dist": -dist / 6, "pos": self.pos.astype(np.float32)}
        return self._obs(), float(success) - 0.1, bool(success), False, info


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=ReachImageEnv, max_episode_steps=20)
