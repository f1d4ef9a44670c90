"""Ecosystem benchmark: recording a Gymnasium env and importing a D4RL-style dataset, against the peers.

    .venv/bin/python benchmarks/bench_ecosystem.py [--quick]

Recording: CartPole-v1 with pre-sampled random actions, steps/s of the bare
env, episodelake's RecordEpisodes (memory and disk), Minari's DataCollector
(+ create_dataset) and an episodata writer loop (disk), all on the same
action sequence. Import: a D4RL-style flat dict (obs 17 x float32, actions
6 x float32, 1000-step episodes ending in timeouts, next_observations given)
into episodelake (disk), into episodata (``from_episodes`` action-out,
zarr) and into Minari (``create_dataset_from_buffers``, hdf5). Absolute
numbers are noisy on a shared machine; the ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import warnings

import gymnasium as gym
import numpy as np


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_env(env, actions, on_reset=None, on_step=None):
    obs, _ = env.reset(seed=0)
    if on_reset:
        on_reset(obs)
    for a in actions:
        obs, r, te, tr, _ = env.step(a)
        if on_step:
            on_step(obs, a, r, te, tr)
        if te or tr:
            obs, _ = env.reset()
            if on_reset:
                on_reset(obs)


def bench_recording(steps: int, tmp: str) -> dict[str, float]:
    import episodata
    import minari
    from episodata.utils import schema_from_gym_spaces as ed_schema

    from episodelake.integrations.gymnasium import RecordEpisodes

    space = gym.make("CartPole-v1").action_space
    space.seed(0)
    actions = [space.sample() for _ in range(steps)]
    out: dict[str, float] = {}

    out["bare env"] = timed(lambda: run_env(gym.make("CartPole-v1"), actions))[0]

    def lake(path):
        env = RecordEpisodes(gym.make("CartPole-v1"), path, keep_partial=True)
        run_env(env, actions)
        env.close()

    out["episodelake RecordEpisodes (memory)"] = timed(lambda: lake(None))[0]
    out["episodelake RecordEpisodes (disk)"] = timed(lambda: lake(os.path.join(tmp, "lake-rec")))[0]

    def mnr():
        os.environ["MINARI_DATASETS_PATH"] = os.path.join(tmp, "minari")
        env = minari.DataCollector(gym.make("CartPole-v1"), data_format="hdf5")
        run_env(env, actions)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env.create_dataset(dataset_id="bench/rec-v0")

    out["minari DataCollector (hdf5)"] = timed(mnr)[0]

    def epd():
        env = gym.make("CartPole-v1")
        ds = episodata.Dataset.create(ed_schema(env.observation_space, env.action_space), path=os.path.join(tmp, "ed"))
        state = {}

        def reset(obs):
            state["w"] = ds.new_episode(obs)

        def step(obs, a, r, te, tr):
            state["w"].add_step({"observations": obs, "actions": a, "rewards": r, "terminated": te, "truncated": tr})

        run_env(env, actions, reset, step)
        ds.flush()

    out["episodata writer loop (zarr)"] = timed(epd)[0]
    return {k: steps / v for k, v in out.items()}


def d4rl_data(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(rows + 1, 17)).astype(np.float32)
    timeouts = np.arange(rows) % 1000 == 999
    next_obs = obs[1:].copy()
    next_obs[timeouts] = rng.normal(size=(int(timeouts.sum()), 17))
    return {
        "observations": obs[:-1],
        "next_observations": next_obs,
        "actions": rng.normal(size=(rows, 6)).astype(np.float32),
        "rewards": rng.normal(size=rows).astype(np.float32),
        "terminals": np.zeros(rows, bool),
        "timeouts": timeouts,
    }


def bench_import(rows: int, tmp: str) -> dict[str, float]:
    import episodata
    import minari
    from minari.data_collector import EpisodeBuffer

    from episodelake.importers import import_dataset
    from episodelake.importers.d4rl import episode_bounds

    data = d4rl_data(rows)
    bounds = episode_bounds(data["terminals"], data["timeouts"])
    out: dict[str, float] = {}
    out["episodelake import d4rl"] = timed(
        lambda: import_dataset("d4rl", data, os.path.join(tmp, "lake-d4rl"), progress=False)
    )[0]

    def ed():
        eps = (
            {
                "observations": data["observations"][a:b],
                "final_observation": data["next_observations"][b - 1],
                "actions": data["actions"][a:b],
                "rewards": data["rewards"][a:b],
                "truncated": bool(data["timeouts"][b - 1]),
            }
            for a, b in bounds
        )
        episodata.Dataset.from_episodes(eps, path=os.path.join(tmp, "ed-d4rl"))

    out["episodata from_episodes (action_out)"] = timed(ed)[0]

    def mn():
        os.environ["MINARI_DATASETS_PATH"] = os.path.join(tmp, "minari")
        buffers = [
            EpisodeBuffer(
                id=i,
                observations=np.concatenate([data["observations"][a:b], data["next_observations"][b - 1 : b]]),
                actions=data["actions"][a:b],
                rewards=data["rewards"][a:b],
                terminations=data["terminals"][a:b],
                truncations=data["timeouts"][a:b],
            )
            for i, (a, b) in enumerate(bounds)
        ]
        obs_space = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
        act_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            minari.create_dataset_from_buffers(
                "bench/d4rl-v0", buffers, observation_space=obs_space, action_space=act_space, data_format="hdf5"
            )

    out["minari create_dataset_from_buffers (hdf5)"] = timed(mn)[0]
    return {k: rows / v for k, v in out.items()}


def report(title: str, unit: str, results: dict[str, float], ours: str) -> None:
    print(f"\n{title}")
    width = max(len(k) for k in results)
    for name, value in results.items():
        ratio = results[ours] / value
        print(f"  {name:<{width}}  {value:>12,.0f} {unit}   episodelake(disk)/this = {ratio:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    steps, rows = (2_000, 20_000) if args.quick else (20_000, 200_000)
    tmp = tempfile.mkdtemp(prefix="bench-ecosystem-")
    try:
        rec = bench_recording(steps, tmp)
        report(f"Recording CartPole-v1, {steps:,} steps", "steps/s", rec, "episodelake RecordEpisodes (disk)")
        imp = bench_import(rows, tmp)
        report(f"Importing a D4RL-style dict, {rows:,} rows", "rows/s", imp, "episodelake import d4rl")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
