"""Disk use of a replay buffer (``capacity=``) at steady state: bytes on disk against live bytes.

Writes a fixed number of one-episode commits of camera episodes (3x32x32 uint8 random frames, 5-15
steps) into a capacity buffer on local disk with the default capacity settings (the version window:
the automatic vacuum keeps the last ``keep_versions`` versions and reclaims the rest on the buffer's
own cadence), then prints the live bytes (the tensor rows of the live episodes), every byte under the
dataset root, their ratio (at the end, and the largest seen every 10 commits once the buffer is full),
the files by folder, the time and the load average. docs/replay.md, "Disk use".

    python benchmarks/bench_replay_disk.py [--commits 600] [--steps 3000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.workers.replay_disk import STEP_BYTES, camera_episode, schema

import episodelake as el


def usage(root: str) -> tuple[Counter[str], Counter[str]]:
    """Bytes and files per top folder (``tensors``, ``episodes``, ``episodes/_delta_log``, ...)."""
    size: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for base, _, names in os.walk(root):
        rel = os.path.relpath(base, root).split(os.sep)
        key = "/".join(rel[:2]) if rel[:2] == ["episodes", "_delta_log"] else rel[0]
        for name in names:
            size[key] += os.path.getsize(os.path.join(base, name))
            files[key] += 1
    return size, files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=600)
    ap.add_argument("--steps", type=int, default=3000, help="capacity in steps")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        path = os.path.join(tmp, "buffer")
        ds = el.Dataset.create(schema(), path, capacity=el.Capacity(steps=args.steps), commit_episodes=10**6)
        seconds, worst, full = 0.0, 0.0, False
        for n in range(args.commits):
            t0 = time.perf_counter()
            ds.append_episodes([camera_episode(n)])
            ds.flush()
            seconds += time.perf_counter() - t0
            full = full or ds._store.table.dt.history(1)[0].get("episodelake.operation") == "EVICT"
            if full and n % 10 == 0:
                live = (ds.num_steps + len(ds)) * STEP_BYTES
                worst = max(worst, sum(usage(path)[0].values()) / live)
        live = (ds.num_steps + len(ds)) * STEP_BYTES  # T + 1 camera rows per episode
        size, files = usage(path)
        disk = sum(size.values())
        print(f"{args.commits} one-episode commits into a {args.steps}-step buffer in {seconds:.1f} s (commits)")
        print(f"  live bytes:  {live / 1e6:8.2f} MB ({len(ds)} episodes, {ds.num_steps} steps)")
        print(f"  disk bytes:  {disk / 1e6:8.2f} MB in {sum(files.values())} files")
        print(f"  ratio:       {disk / live:8.2f} (largest seen once full: {worst:.2f})")
        for key in sorted(size):
            print(f"    {key:22s} {size[key] / 1e6:8.2f} MB {files[key]:6d} files")
        print(f"  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
