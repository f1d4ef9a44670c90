"""Training batches through Ray Data vs the local sampler: batches/s and time to the first batch.

One run builds one local dataset (uint8 camera [3, 64, 64] as a tensor field,
state/action/reward) and reads the same shuffled pass (``sampler=el.Uniform(replacement=False)``,
one seed, epoch 0, ``batch_size`` x window length) three ways:

* the local sampler, ``ds.segment_stream(...)`` (default prefetch);
* ``ds.segments_to_ray(..., concurrency=1)``: one Ray actor reading batches;
* ``ds.segments_to_ray(..., concurrency=2)``: two actors;
* the copy limit: the same number of random windows gathered by NumPy from
  in-memory arrays of the dataset's geometry, one thread, this run (every
  row is printed beside it, so none can exceed it unnoticed).

Time to first batch counts from the call that builds the stream (planning,
actor start-up) to the first batch in hand. The Ray batches are checked equal
to the local sampler's. Prints batches/s and ratios to the copy limit and the local sampler.

    python benchmarks/bench_ray.py [--episodes 120] [--length 64] [--batches 60] [--cpus 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import ray

import episodelake as el
from copy_limit import window_sampler  # benchmarks/ is on sys.path when run as a script

BATCH, SEQ, SEED = 32, 16, 0


def build(path: str, episodes: int, length: int) -> el.Dataset:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (3, 64, 64), "uint8", layout="CHW", storage="tensor", chunk_rows=64),
            el.FieldSpec("state", (8,), "float32"),
            el.FieldSpec("action", (4,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    rng = np.random.default_rng(0)

    def episode() -> dict:
        return {
            "observations": {
                "camera": rng.integers(0, 256, (length + 1, 3, 64, 64), dtype=np.uint8),
                "state": rng.standard_normal((length + 1, 8), dtype=np.float32),
            },
            "actions": rng.standard_normal((length, 4), dtype=np.float32),
            "rewards": rng.standard_normal(length, dtype=np.float32),
        }

    return el.Dataset.from_episodes((episode() for _ in range(episodes)), path, schema=schema)


def timed(batches, limit: int) -> tuple[float, float, list]:
    """(seconds to the first batch, batches/s after it, the episode ids of each batch)."""
    t0 = time.perf_counter()
    ids, first, t1 = [], 0.0, t0
    for i, batch in enumerate(batches()):
        ids.append(np.asarray(batch["episode_id"] if isinstance(batch, dict) else batch.episode_id).copy())
        if i == 0:
            t1 = time.perf_counter()
            first = t1 - t0
        if i + 1 == limit:
            break
    rate = (len(ids) - 1) / max(time.perf_counter() - t1, 1e-9)
    return first, rate, ids


def copy_limit(episodes: int, length: int, batches: int) -> float:
    """Batches/s of the bound: ``batches`` batches of random windows gathered by NumPy from in-memory arrays of
    the dataset's geometry (camera and state per observation row, action and reward per step row), one thread."""
    rng = np.random.default_rng(3)
    rows, steps = episodes * (length + 1), episodes * length
    obs = [rng.integers(0, 256, (rows, 3, 64, 64), dtype=np.uint8), rng.standard_normal((rows, 8), dtype=np.float32)]
    per_step = [rng.standard_normal((steps, 4), dtype=np.float32), rng.standard_normal(steps, dtype=np.float32)]
    sample = window_sampler(obs, per_step, episodes, length, SEQ, BATCH)
    t0 = time.perf_counter()
    for _ in range(batches):
        sample()
    return batches / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=120)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ds = build(f"{tmp}/ds", args.episodes, args.length)
        print(f"{args.episodes} episodes x {args.length} steps, batch {BATCH} x {SEQ}, {args.batches} batches")
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        common = {"batch_size": BATCH, "seed": SEED}

        def local():
            return ds.segment_stream(SEQ, sampler=el.Uniform(replacement=False), **common)

        def on_ray(actors: int):
            def run():
                return ds.segments_to_ray(SEQ, concurrency=actors, **common).iter_batches(
                    batch_size=BATCH, batch_format="numpy"
                )

            return run

        results = {"local sampler": timed(local, args.batches)}
        for actors in (1, 2):
            results[f"ray, {actors} actor{'s' * (actors > 1)}"] = timed(on_ray(actors), args.batches)
        ray.shutdown()
        limit = copy_limit(args.episodes, args.length, args.batches)
    _, base_rate, base_ids = results["local sampler"]
    print(f"copy limit (in-memory gather, one thread, this run): {limit:.1f} batches/s")
    print(f"{'source':<16} {'first batch s':>13} {'batches/s':>10} {'vs limit':>9} {'x local':>8}")
    for name, (first, rate, ids) in results.items():
        same = all(np.array_equal(a, b) for a, b in zip(ids, base_ids, strict=True))
        assert same, f"{name}: batches differ from the local sampler's"
        print(f"{name:<16} {first:>13.2f} {rate:>10.1f} {rate / limit:>9.3f} {rate / base_rate:>8.2f}")


if __name__ == "__main__":
    main()
