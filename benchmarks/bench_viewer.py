"""The viewer's latency over HTTP: the episode list of a large dataset, an episode page with its videos ready.

Two datasets, written with ``append_episodes`` (bulk, columns + ``lengths``):

* list: N episodes (default 100,000; ``--quick``: 10,000) of 4 steps with a
  state, an action, a reward and a ``task`` meta field. Timed over HTTP
  against a viewer in this process: the first list page (cold: the first
  request after start), the same page warm, sorted by return, a filter, and
  a page deep into the list (``OFFSET`` near the end).
* episode: 6 episodes of 300 steps with two 96x128 JPEG cameras. Timed: the
  episode page, then both videos (cold: encoded on this request; warm: served
  from the cache). "video ready" is the page plus both videos, cold.

Goals (issue #24): first list page <= 300 ms, episode page with video ready
<= 2 s on this machine. Each row prints the median of ``REPEATS`` (cold rows:
one try).
Run: ``.venv/bin/python benchmarks/bench_viewer.py [--quick] [--episodes N] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

import episodelake as el

REPEATS = 5
TASKS = np.array(["pick", "place", "push", "stack"])
T_LIST, T_EPISODE, CAMERA = 4, 300, (96, 128)


def build_list(path: str, n: int) -> None:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("state", (3,), "float32"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "string", role="meta"),
        ]
    )
    ds = el.Dataset.create(schema, path)
    rng = np.random.default_rng(0)
    for start in range(0, n, 50_000):
        k = min(50_000, n - start)
        ds.append_episodes(
            {
                "observations": rng.random((k * (T_LIST + 1), 3), dtype=np.float32),
                "actions": rng.random((k * T_LIST, 2), dtype=np.float32),
                "rewards": rng.random(k * T_LIST, dtype=np.float32),
                "meta": {"task": TASKS[rng.integers(0, len(TASKS), k)].tolist()},
            },
            lengths=np.full(k, T_LIST),
        )
    ds.close()


def build_episodes(path: str, n: int = 6) -> None:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("front", (*CAMERA, 3), "uint8", layout="HWC", codec="jpeg", quality=90),
            el.FieldSpec("wrist", (*CAMERA, 3), "uint8", layout="HWC", codec="jpeg", quality=90),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(schema, path, info={"fps": 30})
    y, x = np.mgrid[0 : CAMERA[0], 0 : CAMERA[1]]
    frames = np.stack(
        [np.stack([(x + 2 * t) % 256, (y * 2) % 256, ((x + y + t) // 3) % 256], -1) for t in range(T_EPISODE + 1)]
    ).astype(np.uint8)
    episode = {
        "observations": {"front": frames, "wrist": frames[:, ::-1].copy()},
        "actions": np.zeros((T_EPISODE, 2), np.float32),
        "rewards": np.ones(T_EPISODE, np.float32),
    }
    ds.append_episodes([episode] * n)
    ds.close()


def timed(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        assert r.status == 200, url
        r.read()
    return time.perf_counter() - t


def warm(url: str) -> float:
    return statistics.median(timed(url) for _ in range(REPEATS))


def row(name: str, seconds: float, goal: float | None = None) -> None:
    note = "" if goal is None else f"  (goal <= {goal * 1e3:.0f} ms: {'met' if seconds <= goal else 'MISSED'})"
    print(f"{name:<44} {seconds * 1e3:9.1f} ms{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 episodes in the list dataset")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where to write the datasets (default: a temporary folder)")
    args = parser.parse_args()
    n = args.episodes or (10_000 if args.quick else 100_000)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-viewer-"))
    try:
        t = time.perf_counter()
        build_list(str(root / "list"), n)
        build_episodes(str(root / "episodes"))
        print(f"built {n} list episodes and 6 camera episodes in {time.perf_counter() - t:.1f} s under {root}")

        link = el.view(el.Dataset.open(str(root / "list"), read_only=True))
        try:
            row(f"list page 1 of {n} episodes, cold", timed(link), 0.3)
            row("list page 1, warm", warm(link), 0.3)
            row("list sorted by return (desc)", warm(link + "?sort=return&desc=1"))
            where = urllib.parse.urlencode({"where": "task = 'pick' AND return > 2"})
            row("list filtered (task and return), first call", timed(f"{link}?{where}"))
            row("list filtered, warm", warm(f"{link}?{where}"))
            row(f"list page {n // 50 - 1} (deep OFFSET)", warm(f"{link}?page={n // 50 - 1}"))
        finally:
            link.stop()

        ds = el.Dataset.open(str(root / "episodes"), read_only=True)
        link = el.view(ds)
        try:
            eid = int(ds.episode_ids[0])
            videos = [f"{link}video/{eid}/observation/{k}.webm" for k in ("front", "wrist")]
            page = timed(f"{link}episode/{eid}")
            cold = [timed(v) for v in videos]
            row(f"episode page ({T_EPISODE} steps), cold", page)
            row(f"2 videos {CAMERA[1]}x{CAMERA[0]}, {T_EPISODE + 1} frames, encoded", sum(cold))
            row("episode page with video ready, cold", page + sum(cold), 2.0)
            row("episode page with video ready, warm", warm(f"{link}episode/{eid}") + sum(warm(v) for v in videos))
        finally:
            link.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
