"""Delete/evict: commit latency of a full capacity dataset vs an unbounded one, delete and vacuum times.

Both datasets take the same episodes (8-float observations, 2-float actions,
plus a 3x32x32 uint8 tensor field) one commit at a time on local disk; the
capacity one is filled first, so every measured commit also evicts. Medians
in ms, and their ratio, from one run.

    python benchmarks/bench_evict.py [--commits 200] [--length 50] [--capacity 5000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np

import episodelake as el


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (8,), "float32"),
            el.FieldSpec("camera", (3, 32, 32), "uint8", storage="tensor"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(rng: np.random.Generator, T: int) -> dict:
    return {
        "observations": {
            "state": rng.standard_normal((T + 1, 8), dtype=np.float32),
            "camera": rng.integers(0, 256, (T + 1, 3, 32, 32), dtype=np.uint8),
        },
        "actions": rng.standard_normal((T, 2), dtype=np.float32),
        "rewards": rng.standard_normal(T, dtype=np.float32),
    }


def commit_times(ds: el.Dataset, episodes: list[dict]) -> np.ndarray:
    out = []
    for e in episodes:
        ds.append_episodes([e])
        t0 = time.perf_counter()
        ds.flush()
        out.append(time.perf_counter() - t0)
    return np.array(out) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--length", type=int, default=50)
    ap.add_argument("--capacity", type=int, default=5000, help="steps")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    root = tempfile.mkdtemp()
    try:
        warm = [episode(rng, args.length) for _ in range(args.capacity // args.length + 1)]
        measured = [episode(rng, args.length) for _ in range(args.commits)]
        # vacuum_every above the run: the automatic vacuum is timed separately below
        cap = {"steps": args.capacity, "retention_hours": 0, "vacuum_every": 10**6, "break_old_versions": True}
        plain = el.Dataset.create(schema(), f"{root}/plain", commit_episodes=10**6)
        ring = el.Dataset.create(schema(), f"{root}/ring", capacity=cap, commit_episodes=10**6)
        for ds in (plain, ring):
            ds.append_episodes(warm)
            ds.flush()
        t_plain = commit_times(plain, measured)
        t_ring = commit_times(ring, measured)
        assert ring.num_steps <= args.capacity
        print(f"one-episode commit ({args.length} steps), median ms over {args.commits} commits")
        print(f"  append only:       {np.median(t_plain):7.2f}   p90 {np.percentile(t_plain, 90):7.2f}")
        print(f"  append + evict:    {np.median(t_ring):7.2f}   p90 {np.percentile(t_ring, 90):7.2f}")
        print(f"  ratio evict/plain: {np.median(t_ring) / np.median(t_plain):7.2f}")
        t0 = time.perf_counter()
        report = ring.maintenance.vacuum(retention_hours=0, break_old_versions=True)
        t_vac = time.perf_counter() - t0
        print(
            f"vacuum after {args.commits} evicting commits: {t_vac * 1e3:.1f} ms "
            f"({len(report.table_files)} table files, {len(report.tensor_arrays)} arrays removed)"
        )
        ids = plain.episode_ids[: len(plain) // 10].tolist()
        t0 = time.perf_counter()
        plain.delete(ids)
        t_del = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain.delete(where="length > 0 AND episode_id % 7 = 0")
        t_where = time.perf_counter() - t0
        print(f"delete {len(ids)} ids of {len(ids) * 10}: {t_del * 1e3:.1f} ms; where (1/7): {t_where * 1e3:.1f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
