"""Write throughput and commit latency, episodelake vs memmap-replay-buffer and Minari.

Same data, same process run; prints rates, bytes on disk per payload byte,
and the ratios. The machine is shared and noisy: compare ratios.

1. bulk import of image episodes (200 episodes x 200 steps of 12.5 KB) vs memmap-replay-buffer;
2. step-by-step collection vs memmap-replay-buffer;
3. many tiny episodes (three steps, float32[8] observations): ``from_episodes`` with
   columns + ``lengths`` and with dicts vs Minari ``create_dataset_from_buffers``;
4. a D4RL-style dict through ``import_dataset("d4rl", ...)`` vs Minari on the same episodes;
5. one-episode commit latency (``writer.finish(); ds.flush()``, 100 steps) vs
   memmap-replay-buffer ``store_episode`` + ``flush``.

    python benchmarks/bench_write.py                      # 100k tiny episodes, 200k D4RL rows
    python benchmarks/bench_write.py --tiny 1000000       # the 1M-episode import
    python benchmarks/bench_write.py --quick              # a smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
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


def tiny_columns(n: int, T: int = 3, seed: int = 0) -> dict:
    """``n`` episodes of ``T`` steps as concatenated columns: float32[8] observations, float32[2] actions."""
    rng = np.random.default_rng(seed)
    return {
        "observations": rng.standard_normal((n * (T + 1), 8)).astype(np.float32),
        "actions": rng.standard_normal((n * T, 2)).astype(np.float32),
        "rewards": rng.standard_normal(n * T).astype(np.float32),
        "terminated": np.ones(n, bool),
    }


def bench_tiny(n: int, minari_n: int, root: str) -> dict[str, float]:
    """Episodes/s importing ``n`` three-step episodes (Minari on the first ``minari_n`` of them)."""
    T = 3
    cols = tiny_columns(n, T)
    out = {}
    t0 = time.perf_counter()
    el.Dataset.from_episodes(cols, os.path.join(root, "tiny-cols"), lengths=np.full(n, T))
    out["episodelake from_episodes(columns, lengths)"] = n / (time.perf_counter() - t0)

    def dicts(k: int):
        obs, act, rew = cols["observations"], cols["actions"], cols["rewards"]
        return [
            {
                "observations": obs[i * (T + 1) : (i + 1) * (T + 1)],
                "actions": act[i * T : (i + 1) * T],
                "rewards": rew[i * T : (i + 1) * T],
                "terminated": True,
            }
            for i in range(k)
        ]

    episodes = dicts(n)
    t0 = time.perf_counter()
    el.Dataset.from_episodes(episodes, os.path.join(root, "tiny-dicts"))
    out["episodelake from_episodes(dicts)"] = n / (time.perf_counter() - t0)
    out["minari create_dataset_from_buffers (hdf5)"] = bench_minari(episodes[:minari_n], (8,), (2,), root, "tiny")
    return out


def last_step(T: int, flag: bool) -> np.ndarray:
    """Per-step flags of a ``T``-step episode: ``flag`` on the last step only."""
    out = np.zeros(T, bool)
    out[-1] = flag
    return out


def bench_minari(episodes: list[dict], obs_shape: tuple, act_shape: tuple, root: str, name: str) -> float:
    """Episodes/s of Minari's ``create_dataset_from_buffers`` (hdf5) over dict-form episodes (obs T+1 rows)."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    os.environ["MINARI_DATASETS_PATH"] = os.path.join(root, "minari")
    t0 = time.perf_counter()
    buffers = [
        EpisodeBuffer(
            id=i,
            observations=e["observations"],
            actions=e["actions"],
            rewards=e["rewards"],
            terminations=np.eye(1, len(e["rewards"]), len(e["rewards"]) - 1, dtype=bool)[0]
            & bool(e.get("terminated", False)),
            truncations=np.eye(1, len(e["rewards"]), len(e["rewards"]) - 1, dtype=bool)[0]
            & bool(e.get("truncated", False)),
        )
        for i, e in enumerate(episodes)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            f"bench/{name}-v0",
            buffers,
            observation_space=gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32),
            action_space=gym.spaces.Box(-np.inf, np.inf, act_shape, np.float32),
            data_format="hdf5",
        )
    return len(episodes) / (time.perf_counter() - t0)


D4RL_OURS = "episodelake import_dataset('d4rl')"


def bench_d4rl(rows: int, root: str) -> dict[str, float]:
    """Rows/s importing a D4RL-style dict (episodes of 1000 rows), episodelake vs Minari on the same episodes."""
    from bench_ecosystem import d4rl_data
    from episodelake.importers import import_dataset
    from episodelake.importers.d4rl import episode_bounds

    data = d4rl_data(rows)
    t0 = time.perf_counter()
    import_dataset("d4rl", data, os.path.join(root, "d4rl"), progress=False)
    out = {D4RL_OURS: rows / (time.perf_counter() - t0)}
    episodes = [
        {
            "observations": np.concatenate([data["observations"][a:b], data["next_observations"][b - 1 : b]]),
            "actions": data["actions"][a:b],
            "rewards": data["rewards"][a:b],
            "terminated": bool(data["terminals"][b - 1]),
            "truncated": bool(data["timeouts"][b - 1]),
        }
        for a, b in episode_bounds(data["terminals"], data["timeouts"])
    ]
    out["minari create_dataset_from_buffers (hdf5)"] = (
        bench_minari(episodes, (17,), (6,), root, "d4rl") * rows / len(episodes)
    )
    return out


def bench_commit_latency(commits: int, root: str) -> dict[str, float]:
    """Median ms of committing one finished 100-step episode (float32[8] obs, float32[2] action) on local disk."""
    from memmap_replay_buffer import ReplayBuffer

    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (8,), "float32"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    rng = np.random.default_rng(2)
    obs = rng.standard_normal((101, 8)).astype(np.float32)
    act = rng.standard_normal((100, 2)).astype(np.float32)
    ds = el.Dataset.create(schema, os.path.join(root, "latency"))
    lake = []
    for _ in range(commits):
        writer = ds.new_episode(obs[0])
        for t in range(100):
            writer.add_step({"observations": obs[t + 1], "actions": act[t], "rewards": 1.0})
        t0 = time.perf_counter()
        writer.finish()
        ds.flush()
        lake.append(time.perf_counter() - t0)
    buf = ReplayBuffer(
        os.path.join(root, "mrb-latency"),
        max_episodes=commits,
        max_timesteps=101,
        fields={"observation": ("float", 8), "action": ("float", 2), "reward": "float"},
        overwrite=True,
    )
    act1 = np.concatenate([act, np.zeros((1, 2), np.float32)])
    rew1 = np.ones(101, np.float32)
    mrb = []
    for _ in range(commits):
        t0 = time.perf_counter()
        buf.store_episode(observation=obs, action=act1, reward=rew1)
        buf.flush()
        mrb.append(time.perf_counter() - t0)
    return {
        "episodelake finish + flush": float(np.median(lake)) * 1e3,
        "episodelake p90": float(np.percentile(lake, 90)) * 1e3,
        "memmap-replay-buffer store_episode + flush": float(np.median(mrb)) * 1e3,
    }


def show(title: str, unit: str, results: dict[str, float], ours: str, higher_is_better: bool = True) -> None:
    print(title)
    width = max(len(k) for k in results)
    for name, value in results.items():
        ratio = results[ours] / value if higher_is_better else value / results[ours]
        print(f"  {name:<{width}}  {value:>12,.1f} {unit}   episodelake/this = {ratio:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument("--tiny", type=int, default=None, help="three-step episodes to import (default 100k)")
    parser.add_argument("--minari-tiny", type=int, default=20_000, help="of them, how many Minari writes")
    parser.add_argument("--d4rl-rows", type=int, default=200_000)
    parser.add_argument("--commits", type=int, default=200, help="one-episode commits timed")
    parser.add_argument("--only", choices=["images", "steps", "tiny", "d4rl", "latency"], default=None)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_ecosystem's D4RL data
    run = {args.only} if args.only else {"images", "steps", "tiny", "d4rl", "latency"}
    root = tempfile.mkdtemp(prefix="bench-write-")
    try:
        if "images" in run:
            bench_images(args.episodes or (40 if args.quick else 200), root)
        if "steps" in run:
            bench_steps(20_000 if args.quick else 100_000, root)
        if "tiny" in run:
            n = args.tiny or (10_000 if args.quick else 100_000)
            minari_n = min(n, 2_000 if args.quick else args.minari_tiny)
            title = f"importing {n:,} three-step episodes (Minari: the first {minari_n:,})"
            show(title, "episodes/s", bench_tiny(n, minari_n, root), "episodelake from_episodes(columns, lengths)")
        if "d4rl" in run:
            rows = 20_000 if args.quick else args.d4rl_rows
            show(f"importing a D4RL-style dict, {rows:,} rows", "rows/s", bench_d4rl(rows, root), D4RL_OURS)
        if "latency" in run:
            commits = 30 if args.quick else args.commits
            title = f"one-episode commit, median of {commits} (100 steps, local disk)"
            show(title, "ms", bench_commit_latency(commits, root), "episodelake finish + flush", higher_is_better=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_images(n: int, root: str) -> None:
    T = 200
    steps = n * T
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
    print(
        f"  ratio episodelake / memmap-replay-buffer: {results['episodelake'] / results['memmap-replay-buffer']:.2f}x"
    )


def bench_steps(small: int, root: str) -> None:
    print(f"step-by-step collection: {small} steps of obs float32[4], int action, float reward")
    el_secs = bench_steps_episodelake(small, root)
    mrb_secs = bench_steps_memmap(small, root)
    print(f"  {'episodelake':22s} {small / el_secs:10,.0f} steps/s")
    print(f"  {'memmap-replay-buffer':22s} {small / mrb_secs:10,.0f} steps/s")
    print(f"  ratio episodelake / memmap-replay-buffer: {mrb_secs / el_secs:.2f}x")


if __name__ == "__main__":
    main()
