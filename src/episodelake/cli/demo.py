"""``episodelake demo``: collect CartPole episodes, query them with SQL, sample a batch."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.errors import DatasetExistsError, MissingDependencyError
from ..core.schema import FieldSpec, schema_from_gym_spaces
from ..dataset import Dataset
from ..storage import layout
from ..storage.location import Location, resolve


def run_demo(
    path: str,
    episodes: int = 50,
    seed: int = 0,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Dataset:
    """Write ``episodes`` CartPole episodes to a new dataset at ``path``, then read them back.

    ``path`` may be any root :meth:`Dataset.create` takes (``s3://...`` with ``storage_options``).
    It must be new or empty; a dataset there is replaced only with ``overwrite`` (a previous demo),
    and a folder holding anything else is never touched (see :func:`check_target`).
    """
    check_target(resolve(path, dict(storage_options or {})), overwrite)
    try:
        import gymnasium as gym
    except ImportError as exc:  # the demo needs the gym extra
        raise MissingDependencyError('the demo needs Gymnasium: pip install "episodelake[gym]"') from exc

    env = gym.make("CartPole-v1")
    schema = schema_from_gym_spaces(
        env.observation_space,
        env.action_space,
        meta=[FieldSpec("policy", (), "str", role="meta"), FieldSpec("seed", (), "int64", role="meta")],
    )
    ds = Dataset.create(schema, path, storage_options=storage_options, partition_by=["policy"], overwrite=overwrite)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for ep in range(episodes):
        policy = "random" if ep % 2 else "lean"
        obs, _ = env.reset(seed=seed + ep)
        writer = ds.new_episode(obs, policy=policy, seed=seed + ep)
        done = False
        while not done:
            # "lean" pushes the cart toward the side the pole leans to: it balances longer
            action = int(obs[2] > 0) if policy == "lean" else int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            step = {"observations": obs, "actions": action, "rewards": reward}
            writer.add_step({**step, "terminated": terminated, "truncated": truncated})
            done = terminated or truncated
    ds.close()
    took = time.perf_counter() - start
    print(f"collected {len(ds)} episodes, {ds.num_steps} steps into {ds.location.url} in {took:.2f} s")
    print(f"committed as table version {ds.version}")

    query = (
        "SELECT policy, count(*) AS episodes, avg(length) AS mean_length FROM episodes GROUP BY policy ORDER BY policy"
    )
    print(f"\nSQL> {query}")
    relation = ds.sql(query)
    assert relation is not None  # a SELECT always has a result
    for row in relation.fetchall():
        print(f"  {row[0]:>6}: {row[1]} episodes, mean length {row[2]:.1f}")

    good = ds.where("policy = 'lean' AND length >= 20")
    print(f"\nds.where(\"policy = 'lean' AND length >= 20\") -> {len(good)} episodes")
    stats = good.stats()
    print(f"  observation mean {np.round(stats['observation']['mean'], 3)}")

    stream = good.segment_stream(16, batch_size=32, seed=seed)
    batch = stream.sample()
    print("\nsegment_stream(16, batch_size=32).sample():")
    print(f"  obs {batch.obs.shape}, next_obs {batch.next_obs.shape}")
    print(f"  action {batch.action.shape}, mask {batch.mask.shape}")
    same = np.array_equal(batch.obs[:, 1:], batch.next_obs[:, :-1])
    print(f"  obs[t + 1] == next_obs[t] inside each segment: {same}")
    return ds


def check_target(location: Location, overwrite: bool) -> None:
    """Refuse to write the demo over anything: a non-empty folder that is not a dataset always, a dataset
    unless ``overwrite`` (:class:`DatasetExistsError`, before anything is written)."""
    fs = location.fs
    if not fs.exists(location.path) or not fs.ls(location.path):
        return
    if not location.exists(layout.DESCRIPTOR):
        raise DatasetExistsError(
            f"{location.url} is not empty and holds no episodelake dataset; the demo writes only to a new or "
            "empty folder (give another path)"
        )
    if not overwrite:
        raise DatasetExistsError(
            f"a dataset already exists at {location.url}; pass --overwrite (overwrite=True) to replace it "
            "with a new demo, or give another path"
        )
