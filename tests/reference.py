"""Independent ground truth for tests: random episodes kept as plain NumPy.

Nothing here imports episodelake: expected values are computed from the raw
arrays the tests generated, never from the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RawEpisode:
    """One episode as plain arrays: obs fields have T + 1 rows, the rest T rows."""

    obs: dict[str, np.ndarray]
    action: dict[str, np.ndarray]
    reward: np.ndarray
    terminated: bool
    truncated: bool
    meta: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.reward)

    def as_dict(self, unwrap_action: bool = False) -> dict:
        """The dict form Dataset.from_episodes takes (initial_observation + T rows)."""
        return {
            "initial_observation": {k: v[0] for k, v in self.obs.items()},
            "observations": {k: v[1:] for k, v in self.obs.items()},
            "actions": self.action["action"] if unwrap_action else self.action,
            "rewards": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "meta": self.meta,
        }


def random_episode(rng: np.random.Generator, length: int, image: bool = True, tasks=("pick", "place")) -> RawEpisode:
    obs = {"state": rng.standard_normal((length + 1, 5)).astype(np.float32)}
    if image:
        obs["camera"] = rng.integers(0, 256, (length + 1, 3, 8, 8), dtype=np.uint8)
    flag = rng.integers(0, 3)
    return RawEpisode(
        obs=obs,
        action={"action": rng.integers(0, 4, (length,)).astype(np.int64)},
        reward=rng.standard_normal(length).astype(np.float32),
        terminated=flag == 1,
        truncated=flag == 2,
        meta={"task": str(rng.choice(tasks)), "success": bool(rng.integers(0, 2))},
    )


def expected_segment(ep: RawEpisode, start: int, length: int, pad: str | None = "suffix") -> dict[str, np.ndarray]:
    """Naive reference of a segment: transitions [start, start + length), padded with zeros.

    Returns obs/next_obs per obs field, action, reward, terminated, truncated, mask.
    """
    stop = min(start + length, ep.length)
    real = stop - start
    out: dict[str, np.ndarray] = {}

    def place(values: np.ndarray) -> np.ndarray:
        buf = np.zeros((length, *values.shape[1:]), values.dtype)
        if pad == "prefix":
            buf[length - real :] = values
        else:
            buf[:real] = values
        return buf

    for k, v in ep.obs.items():
        out[f"obs/{k}"] = place(v[start:stop])
        out[f"next_obs/{k}"] = place(v[start + 1 : stop + 1])
    for k, v in ep.action.items():
        out[f"action/{k}"] = place(v[start:stop])
    out["reward"] = place(ep.reward[start:stop])
    term = np.zeros(ep.length, bool)
    trunc = np.zeros(ep.length, bool)
    term[-1] = ep.terminated
    trunc[-1] = ep.truncated
    out["terminated"] = place(term[start:stop])
    out["truncated"] = place(trunc[start:stop])
    out["mask"] = place(np.ones(real, bool))
    return out
