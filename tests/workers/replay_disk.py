"""A replay buffer written for a fixed number of commits, for the disk-use test and benchmark.

``python -m tests.workers.replay_disk PATH COMMITS [CAPACITY_STEPS]`` creates a capacity dataset at
PATH (default capacity: the version window) and commits episodes ``0 .. COMMITS-1``, one episode per
commit, each :func:`camera_episode` of its number; it prints ``done VERSION``. Nothing here computes
expected values with episodelake: :func:`camera_episode` is plain NumPy.
"""

from __future__ import annotations

import sys

import numpy as np

import episodelake as el

CAMERA = (3, 32, 32)
STEP_BYTES = int(np.prod(CAMERA))  # uint8


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", CAMERA, "uint8", storage="tensor"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("n", (), "int64", role="meta"),
        ]
    )


def length_of(n: int) -> int:
    return int(np.random.default_rng([7, n]).integers(5, 16))


def camera_episode(n: int) -> dict:
    """Episode number ``n``: random frames (incompressible) seeded by ``n``."""
    rng = np.random.default_rng([11, n])
    T = length_of(n)
    return {
        "observations": rng.integers(0, 256, (T + 1, *CAMERA), dtype=np.uint8),
        "actions": rng.standard_normal((T, 2)).astype(np.float32),
        "rewards": rng.standard_normal(T).astype(np.float32),
        "terminated": True,
        "meta": {"n": n},
    }


def write(path: str, commits: int, steps: int) -> el.Dataset:
    ds = el.Dataset.create(schema(), path, capacity=el.Capacity(steps=steps), commit_episodes=10**6)
    for n in range(commits):
        ds.append_episodes([camera_episode(n)])
        ds.flush()
    return ds


def main(argv: list[str]) -> int:
    path, commits = argv[0], int(argv[1])
    steps = int(argv[2]) if len(argv) > 2 else 600
    ds = write(path, commits, steps)
    print(f"done {ds.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
