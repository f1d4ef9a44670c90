"""Episodes numbered ``n`` for the capacity/delete tests, a FIFO reference model, and worker processes.

``python -m tests.workers.replay write PATH FIRST COUNT PER_COMMIT [LENGTHS_SEED]`` opens the dataset
at PATH (its capacity comes from the descriptor) and appends episodes FIRST, FIRST+1, ... flushing every
PER_COMMIT; it prints ``done VERSION``.

``python -m tests.workers.replay read PATH`` opens the latest version, prints ``ready N`` with the
episode numbers it sees, waits for a line on stdin, then reads every one of those episodes again from
the same (now old) snapshot and prints ``ok`` if each equals the reference (exit 1 otherwise).

Nothing here computes expected values with episodelake: :func:`episode` and :class:`Fifo` are plain NumPy.
"""

from __future__ import annotations

import sys

import numpy as np

import episodelake as el


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (4,), "float32"),
            el.FieldSpec("camera", (3, 16, 16), "uint8", storage="tensor", chunk_rows=8),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("n", (), "int64", role="meta"),
            el.FieldSpec("kind", (), "str", role="meta"),
        ]
    )


def length_of(n: int, seed: int = 0) -> int:
    return int(np.random.default_rng([seed, n]).integers(1, 12))


def episode(n: int, length: int | None = None) -> dict:
    """Episode number ``n``: every value derived from ``n`` (camera rows hold ``n % 251`` and the row index)."""
    T = length_of(n) if length is None else length
    rows = np.arange(T + 1)
    camera = np.empty((T + 1, 3, 16, 16), np.uint8)
    camera[:] = ((n % 251 + rows) % 256).astype(np.uint8)[:, None, None, None]
    return {
        "observations": {
            "state": (n + rows[:, None] * 0.5 + np.arange(4)).astype(np.float32),
            "camera": camera,
        },
        "actions": (rows[:T] + n) % 3,
        "rewards": np.full(T, n % 7, np.float32),
        "terminated": True,
        "meta": {"n": n, "kind": "even" if n % 2 == 0 else "odd"},
    }


def check_episode(ref: el.EpisodeRef) -> None:
    """``ref`` holds exactly :func:`episode` of its number (AssertionError otherwise)."""
    n = int(ref.meta["n"])
    want = episode(n, ref.length)
    seg = ref.read()
    obs = seg.data
    np.testing.assert_array_equal(obs["observation/state"], want["observations"]["state"])
    np.testing.assert_array_equal(obs["observation/camera"], want["observations"]["camera"])
    np.testing.assert_array_equal(obs["action"], want["actions"])


class Fifo:
    """The reference replay buffer: episodes in arrival order, the oldest dropped while over capacity."""

    def __init__(self, steps: int | None = None, episodes: int | None = None) -> None:
        self.steps, self.episodes = steps, episodes
        self.live: list[tuple[int, int]] = []  # (n, length)

    def commit(self, batch: list[tuple[int, int]]) -> None:
        self.live += batch
        while self.live and (
            (self.episodes is not None and len(self.live) > self.episodes)
            or (self.steps is not None and sum(length for _, length in self.live) > self.steps)
        ):
            self.live.pop(0)

    @property
    def numbers(self) -> list[int]:
        return [n for n, _ in self.live]


def live_numbers(ds: el.Dataset | el.DatasetView) -> list[int]:
    """Episode numbers of ``ds`` in episode order."""
    return [int(e.meta["n"]) for e in ds.episodes()]


def main(argv: list[str]) -> int:
    if argv[0] == "write":
        path, first, count, per_commit = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        ds = el.Dataset.open(path, commit_episodes=10**6)
        for i in range(first, first + count, per_commit):
            ds.append_episodes(episode(n) for n in range(i, min(first + count, i + per_commit)))
            ds.flush()
        print(f"done {ds.version}", flush=True)
        return 0
    if argv[0] == "read":
        ds = el.Dataset.open(argv[1], read_only=True)
        refs = list(ds.episodes())
        print("ready", *[int(r.meta["n"]) for r in refs], flush=True)
        sys.stdin.readline()
        for ref in refs:
            check_episode(ref)
        print("ok", flush=True)
        return 0
    raise SystemExit(f"unknown command {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
