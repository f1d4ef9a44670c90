"""A replay buffer written for a fixed number of commits, for the disk-use test and benchmark.

``python -m tests.workers.replay_disk PATH COMMITS [CAPACITY_STEPS]`` creates a capacity dataset at
PATH (default capacity: the version window) and commits episodes ``0 .. COMMITS-1``, one episode per
commit, each :func:`camera_episode` of its number; it prints ``done VERSION``.
``python -m tests.workers.replay_disk ROLE PATH TRUTH ITERATIONS``: one process of the race (:func:`race`).
Nothing here computes expected values with episodelake: :func:`camera_episode` is plain NumPy.
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


def check_episode(ref: el.EpisodeRef) -> None:
    """``ref`` holds exactly :func:`camera_episode` of its number (AssertionError otherwise)."""
    want = camera_episode(int(ref.meta["n"]))
    seg = ref.read()
    np.testing.assert_array_equal(seg.data["observation/camera"], want["observations"])
    np.testing.assert_array_equal(seg.data["action"], want["actions"])
    np.testing.assert_array_equal(seg.data["reward"], want["rewards"])


def race(role: str, path: str, truth: str, iterations: int) -> None:
    """One process of the window-vacuum race (tests/test_replay_disk.py): any exception exits nonzero.

    ``evict``: appends episodes ``3i .. 3i+2`` (one commit each ``i``; the dataset's capacity and
    automatic vacuum from its descriptor) and records them in ``truth`` once committed. ``compact``:
    compacts in a loop. ``vacuum``: vacuums with a window of one version in a loop. ``read``: follows
    the latest version until the writer recorded its last commit and reads every episode: exactly its
    episode, or an episodelake error (a file of a version that left the window meanwhile), never other
    data; prints how many of each.
    """
    from episodelake.ops.maintenance import vacuum

    ds = el.Dataset.open(path, commit_episodes=10**6)
    if role == "evict":
        for i in range(iterations):
            numbers = range(3 * i, 3 * i + 3)
            ds.append_episodes([camera_episode(n) for n in numbers])
            ds.flush()
            with open(truth, "a") as fh:
                fh.write(" ".join(map(str, numbers)) + "\n")
    elif role == "compact":
        for _ in range(iterations):
            ds.maintenance.compact()
    elif role == "vacuum":
        for _ in range(iterations):
            vacuum(ds._store, keep_versions=1)
    elif role == "read":
        exact = refused = rounds = 0

        def written() -> int:
            with open(truth, "a+") as fh:
                fh.seek(0)
                return len(fh.readlines())

        while rounds < 20_000 and (rounds < iterations or written() < iterations):  # until the writer is done
            rounds += 1
            ds.refresh()
            try:
                for ref in ds.episodes():
                    check_episode(ref)
                    exact += 1
            except el.EpisodeLakeError:
                refused += 1
        print(f"read {exact} exact, {refused} refused", flush=True)
    else:
        raise SystemExit(f"unknown role {role!r}")


def main(argv: list[str]) -> int:
    if argv[0] in ("evict", "compact", "vacuum", "read"):
        race(argv[0], argv[1], argv[2], int(argv[3]))
        return 0
    path, commits = argv[0], int(argv[1])
    steps = int(argv[2]) if len(argv) > 2 else 600
    ds = write(path, commits, steps)
    print(f"done {ds.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
