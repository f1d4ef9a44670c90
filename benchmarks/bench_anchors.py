"""Anchor selection: ``segment_stream(anchors=el.Anchors(...))`` over many steps, against a Python loop and DuckDB.

Workload: N episodes of 50-150 steps (mean 100; default 100,000 episodes =
10M steps, ``--quick``: 10,000 = 1M steps), observations ``state``
float32[4], ``action`` int64, ``reward`` float32 uniform in [0, 1), all
table fields. Anchors: ``reward > 0.99`` (about 1% of the steps), each the
last step of a 16-step window (``offset=-15``). In one process, on the same
files:

* **first batch, cold**: a freshly opened dataset, ``segment_stream(...,
  anchors=...)`` and its first batch of 256 (the snapshot's index scan, the
  anchor query, the first read; median of 3 fresh opens); the same for a
  stream without anchors, so the anchors' own share shows;
* **warm, same anchors**: another stream over the same snapshot (its anchors
  are cached per snapshot) to its first batch, median of repeats;
* **warm, new predicate**: a stream whose threshold changes every repeat (one
  anchor query each), median of repeats;
* peers: a naive Python loop over every episode (``ref.read().reward``,
  ``np.flatnonzero``), and one bare DuckDB query over the raw Delta files
  (``read_parquet`` + ``unnest``), the bound.

Ratios are peer / ours. Goals (issue 22, 10M steps): first batch <= 1 s,
warm <= 100 ms.
Run: ``.venv/bin/python benchmarks/bench_anchors.py [--quick] [--episodes N] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from deltalake import DeltaTable

import episodelake as el

THRESHOLD = 0.99
WINDOW = el.Window(16, pad=None)
BATCH = 256
REPEATS = 5
COLD_REPEATS = 3
PER_CALL = 20_000  # episodes per append_episodes call while building


def bench_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (4,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def build(path: str, episodes: int, seed: int = 0) -> int:
    """N random episodes appended in bulk; returns the number of steps."""
    rng = np.random.default_rng(seed)
    ds = el.Dataset.create(bench_schema(), path, overwrite=True)
    steps = 0
    for lo in range(0, episodes, PER_CALL):
        lengths = rng.integers(50, 151, min(PER_CALL, episodes - lo))
        steps += int(lengths.sum())
        ds.append_episodes(
            {
                "initial_observation": rng.random(4, dtype=np.float32),
                "observations": rng.random((T, 4), dtype=np.float32),
                "actions": rng.integers(0, 8, T),
                "rewards": rng.random(T, dtype=np.float32),
                "terminated": True,
            }
            for T in lengths.tolist()
        )
    ds.close()
    return steps


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def first_batch(ds: el.Dataset, anchors: el.Anchors | None) -> el.Batch:
    stream = ds.segment_stream(WINDOW, batch_size=BATCH, seed=0, prefetch=0, anchors=anchors)
    return next(stream)


def naive_loop(ds: el.Dataset) -> int:
    """The anchors found by a Python loop over every episode: how it is done without a steps predicate."""
    found = 0
    for ref in ds.episodes():
        t = np.flatnonzero(ref.read().reward > THRESHOLD)
        found += int((t - 15 >= 0).sum())
    return found


def bare_duckdb(path: str) -> int:
    """One DuckDB query over the raw Delta files: the steps with a reward above the threshold."""
    files = DeltaTable(str(Path(path) / "episodes")).file_uris()
    con = duckdb.connect()
    query = (
        "SELECT episode_id, t FROM (SELECT episode_id, unnest(range(length)) AS t, unnest(reward) AS r "
        f"FROM read_parquet($files)) WHERE r > {THRESHOLD}"
    )
    return len(con.execute(query, {"files": files}).fetchnumpy()["t"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 episodes (1M steps)")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where to build the dataset (default: a temp dir)")
    args = parser.parse_args()
    episodes = args.episodes or (10_000 if args.quick else 100_000)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_anchors_"))
    path = str(root / "ds")
    try:
        t_build, steps = timed(lambda: build(path, episodes))
        print(f"{episodes:,} episodes, {steps:,} steps, built in {t_build:.1f} s")
        anchors = el.Anchors("reward > $x", offset=-15, params={"x": THRESHOLD})

        plains, colds = [], []
        for _ in range(COLD_REPEATS):  # each on a freshly opened dataset (a new snapshot: nothing cached)
            plains.append(timed(lambda: first_batch(el.Dataset.open(path), None))[0])
            seconds, (ds, batch) = timed(lambda: (ds := el.Dataset.open(path), first_batch(ds, anchors)))
            colds.append(seconds)
        cold_plain, cold = statistics.median(plains), statistics.median(colds)
        assert (batch.reward[:, -1] > THRESHOLD).all() and batch.mask.all()
        warm = statistics.median(timed(lambda: first_batch(ds, anchors))[0] for _ in range(REPEATS))
        thresholds = THRESHOLD - 1e-4 * np.arange(1, 1 + REPEATS)
        fresh = [el.Anchors("reward > $x", offset=-15, params={"x": float(x)}) for x in thresholds]
        warm_new = statistics.median(timed(lambda a=a: first_batch(ds, a))[0] for a in fresh)
        count = ds.segment_stream(WINDOW, sampler=el.Sequential(), anchors=anchors).index.total

        t_loop, looped = timed(lambda: naive_loop(ds))
        assert looped == count, (looped, count)
        bare = statistics.median(timed(lambda: bare_duckdb(path))[0] for _ in range(REPEATS))

        print(f"anchors: {count:,} segments of 16 steps ending at reward > {THRESHOLD}")
        rows = [
            ("first batch, cold (open + anchors + read)", cold, "goal <= 1 s at 10M steps"),
            ("  same stream without anchors", cold_plain, f"anchors add {(cold - cold_plain) * 1e3:.0f} ms"),
            ("warm, same anchors (cached per snapshot)", warm, "goal <= 100 ms at 10M steps"),
            ("warm, new predicate (one anchor query)", warm_new, ""),
            ("naive Python loop over episodes", t_loop, ""),
            ("one bare DuckDB query over the raw files", bare, "the bound"),
        ]
        for name, seconds, note in rows:
            print(f"  {name:<46} {seconds * 1e3:>10.1f} ms  {note}")
        print(
            f"ratios: loop / new predicate = {t_loop / warm_new:.1f}x, loop / cold = {t_loop / cold:.1f}x, "
            f"loop / warm = {t_loop / warm:.0f}x, new predicate / bare DuckDB = {warm_new / bare:.2f}x"
        )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
