"""Write throughput: bulk import and step-by-step collection, episodelake vs memmap-replay-buffer.

Same data, same process run; prints steps/s, MB/s, bytes on disk per payload
byte, and the ratios. The machine is shared and noisy: compare ratios.

    python benchmarks/bench_write.py            # 200 episodes x 200 steps of 12.5 KB
    python benchmarks/bench_write.py --quick    # 40 episodes
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import episodelake as el


def disk_bytes(path: str) -> int:
    return sum(f.stat().st_blocks * 512 for f in Path(path).rglob("*") if f.is_file())


def make_episodes(n: int, T: int, seed: int = 0) -> list[dict]:
    """Episodes of 12.5 KB steps: uint8[3,64,64] camera + float32[64] state (+ action, reward)."""
    rng = np.random.default_rng(seed)
    return [
        {
            "observations": {
                "camera": rng.integers(0, 256, (T + 1, 3, 64, 64), dtype=np.uint8),
                "state": rng.standard_normal((T + 1, 64)).astype(np.float32),
            },
            "actions": rng.standard_normal((T, 4)).astype(np.float32),
            "rewards": rng.standard_normal(T).astype(np.float32),
            "terminated": True,
        }
        for _ in range(n)
    ]


def payload_bytes(episodes: list[dict]) -> int:
    obs = sum(e["observations"]["camera"].nbytes + e["observations"]["state"].nbytes for e in episodes)
    return obs + sum(e["actions"].nbytes + e["rewards"].nbytes for e in episodes)


def bench_bulk_episodelake(episodes: list[dict], root: str) -> tuple[float, int]:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (3, 64, 64), "uint8", layout="CHW"),
            el.FieldSpec("state", (64,), "float32"),
            el.FieldSpec("action", (4,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    path = os.path.join(root, "el-bulk")
    t0 = time.perf_counter()
    ds = el.Dataset.create(schema, path)
    ds.append_episodes(episodes)
    ds.flush()
    return time.perf_counter() - t0, disk_bytes(path)


def bench_bulk_memmap(episodes: list[dict], root: str) -> tuple[float, int]:
    from memmap_replay_buffer import ReplayBuffer

    path = os.path.join(root, "mrb-bulk")
    T = len(episodes[0]["rewards"])
    t0 = time.perf_counter()
    buf = ReplayBuffer(
        path,
        max_episodes=len(episodes),
        max_timesteps=T + 1,
        fields={
            "camera": ("uint8", (3, 64, 64)),
            "state": ("float", 64),
            "action": ("float", 4),
            "reward": "float",
        },
        overwrite=True,
    )
    for e in episodes:
        # memmap-replay-buffer stores one row per timestep; it keeps obs T+1 rows like us
        act = np.concatenate([e["actions"], np.zeros((1, 4), np.float32)])
        rew = np.concatenate([e["rewards"], np.zeros(1, np.float32)])
        buf.store_episode(camera=e["observations"]["camera"], state=e["observations"]["state"], action=act, reward=rew)
    buf.flush()
    return time.perf_counter() - t0, disk_bytes(path)


def bench_steps_episodelake(n_steps: int, root: str) -> float:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (4,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(schema, os.path.join(root, "el-steps"))
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((n_steps + 1, 4)).astype(np.float32)
    t0 = time.perf_counter()
    writer = ds.new_episode(obs[0])
    for t in range(n_steps):
        end = (t + 1) % 200 == 0
        writer.add_step({"observations": obs[t + 1], "actions": t % 2, "rewards": 1.0, "terminated": end})
        if end and t + 1 < n_steps:
            writer = ds.new_episode(obs[t + 1])
    ds.flush()
    return time.perf_counter() - t0


def bench_steps_memmap(n_steps: int, root: str) -> float:
    from memmap_replay_buffer import ReplayBuffer

    rng = np.random.default_rng(1)
    obs = rng.standard_normal((n_steps + 1, 4)).astype(np.float32)
    buf = ReplayBuffer(
        os.path.join(root, "mrb-steps"),
        max_episodes=n_steps // 200 + 1,
        max_timesteps=201,
        fields={"observation": ("float", 4), "action": "int", "reward": "float"},
        overwrite=True,
    )
    t0 = time.perf_counter()
    for start in range(0, n_steps, 200):
        with buf.one_episode():
            for t in range(start, min(start + 200, n_steps)):
                buf.store(observation=obs[t], action=t % 2, reward=1.0)
    buf.flush()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--episodes", type=int, default=None)
    args = parser.parse_args()
    n = args.episodes or (40 if args.quick else 200)
    T = 200
    steps = n * T
    root = tempfile.mkdtemp(prefix="bench-write-")
    try:
        episodes = make_episodes(n, T)
        payload = payload_bytes(episodes)
        print(f"bulk import: {n} episodes x {T} steps, {payload / steps / 1e3:.1f} KB/step, {payload / 1e6:.0f} MB")
        results = {}
        for name, fn in (("episodelake", bench_bulk_episodelake), ("memmap-replay-buffer", bench_bulk_memmap)):
            secs, disk = fn(episodes, root)
            results[name] = steps / secs
            print(
                f"  {name:22s} {steps / secs:10,.0f} steps/s {payload / secs / 1e6:8.0f} MB/s"
                f"   disk/payload {disk / payload:.3f}"
            )
        ratio = results["episodelake"] / results["memmap-replay-buffer"]
        print(f"  ratio episodelake / memmap-replay-buffer: {ratio:.2f}x")
        small = 20_000 if args.quick else 100_000
        print(f"step-by-step collection: {small} steps of obs float32[4], int action, float reward")
        el_secs = bench_steps_episodelake(small, root)
        mrb_secs = bench_steps_memmap(small, root)
        print(f"  {'episodelake':22s} {small / el_secs:10,.0f} steps/s")
        print(f"  {'memmap-replay-buffer':22s} {small / mrb_secs:10,.0f} steps/s")
        print(f"  ratio episodelake / memmap-replay-buffer: {mrb_secs / el_secs:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
