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


def segment_starts(lengths, length: int, pad: str | None = "suffix", stride: int = 1) -> list[tuple[int, int]]:
    """Every valid segment as (episode number, first transition), episode after episode.

    A short episode (fewer than ``length`` transitions) has one segment, starting
    at 0 for suffix padding and at ``T - length`` (negative) for prefix padding.
    """
    out = []
    for e, T in enumerate(lengths):
        if length <= T:
            s = 0
            while s + length <= T:
                out.append((e, s))
                s += stride
        elif pad is not None and T > 0:
            out.append((e, 0 if pad == "suffix" else T - length))
    return out


def expected_all_obs(ep: RawEpisode, first: int, length: int) -> dict[str, np.ndarray]:
    """The ``length + 1`` observation rows from row ``first`` (may be negative); zeros outside the episode."""
    out = {}
    for k, v in ep.obs.items():
        buf = np.zeros((length + 1, *v.shape[1:]), v.dtype)
        for i in range(length + 1):
            if 0 <= first + i <= ep.length:
                buf[i] = v[first + i]
        out[k] = buf
    return out


def expected_transition(
    ep: RawEpisode, t: int, n_step: int, gamma: float, history: int = 1, horizon: int = 1
) -> dict[str, np.ndarray]:
    """Naive n-step transition ``t``: frame stacks (zeros before the start), action chunk, return, discount."""
    m = 0
    ret = 0.0
    while m < n_step and t + m < ep.length:
        ret += gamma**m * float(ep.reward[t + m])
        m += 1
    at_end = t + m == ep.length
    terminated = at_end and ep.terminated
    out: dict[str, np.ndarray] = {
        "reward": np.float32(ret),
        "n_steps": np.int64(m),
        "terminated": np.bool_(terminated),
        "truncated": np.bool_(at_end and ep.truncated),
        "discount": np.float32(0.0 if terminated else gamma**m),
        "obs_mask": np.array([t - history + 1 + i >= 0 for i in range(history)]),
        "next_obs_mask": np.array([t + m - history + 1 + i >= 0 for i in range(history)]),
        "action_mask": np.array([t + i < ep.length for i in range(horizon)]),
    }
    for k, v in ep.obs.items():
        for name, end in (("obs", t), ("next_obs", t + m)):
            stack = np.zeros((history, *v.shape[1:]), v.dtype)
            for i in range(history):
                if end - history + 1 + i >= 0:
                    stack[i] = v[end - history + 1 + i]
            out[f"{name}/{k}"] = stack
    for k, v in ep.action.items():
        chunk = np.zeros((horizon, *v.shape[1:]), v.dtype)
        for i in range(horizon):
            if t + i < ep.length:
                chunk[i] = v[t + i]
        out[f"action/{k}"] = chunk
    return out
