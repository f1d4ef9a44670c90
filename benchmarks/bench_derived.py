"""Benchmark 4 (issue 12): ``update`` of a per-step float column on 1M steps vs rewriting the episode table.

One local dataset of ``--episodes`` episodes of ``--length`` steps (8-float
observations, 2-float actions, all in the episode table). Measured in the
same run, on the same data:

* ``update all``: discounted returns of every step written with
  ``ds.columns.update`` (one merge into the derived side table + one metadata commit);
* ``update again``: the same, over existing values (an upsert);
* ``update 1%``: the returns of 1% of the episodes;
* ``rewrite table``: what adding the column to the episode table itself would
  cost: read the whole table and write it back with deltalake
  (``mode="overwrite"``), the minimum such a rewrite does.

    python benchmarks/bench_derived.py [--episodes 1000] [--length 1000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np
from deltalake import DeltaTable, write_deltalake

import episodelake as el


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (8,), "float32"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("returns", (), "float32", role="extra", derived=True),
        ]
    )


def discounted(rewards: np.ndarray, lengths: np.ndarray, gamma: float = 0.99) -> np.ndarray:
    """Discounted returns of every step, episode by episode (all rows in one array)."""
    out = np.empty_like(rewards)
    start = 0
    for n in lengths:
        acc = 0.0
        for t in range(start + n - 1, start - 1, -1):
            acc = rewards[t] + gamma * acc
            out[t] = acc
        start += n
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--length", type=int, default=1000)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench_derived_")
    try:
        rng = np.random.default_rng(0)
        n, T = args.episodes, args.length
        ds = el.Dataset.create(schema(), f"{root}/ds", commit_episodes=10**6)
        for lo in range(0, n, 100):
            ds.append_episodes(
                {
                    "observations": rng.standard_normal((T + 1, 8), dtype=np.float32),
                    "actions": rng.standard_normal((T, 2), dtype=np.float32),
                    "rewards": rng.standard_normal(T, dtype=np.float32),
                }
                for _ in range(lo, min(n, lo + 100))
            )
            ds.flush()
        steps = int(ds.num_steps)
        rewards = ds.to_numpy()["reward"]
        returns = discounted(rewards.astype(np.float64), np.full(n, T)).astype(np.float32)
        t_all = timed(lambda: ds.columns.update({"extra/returns": returns}))
        t_again = timed(lambda: ds.columns.update({"extra/returns": returns + 1}))
        some = ds.episode_ids[: max(1, n // 100)]
        t_some = timed(lambda: ds.columns.update({"extra/returns": [returns[:T]] * len(some)}, some))
        check = ds.sql('SELECT sum("extra/returns") AS s FROM steps').fetchnumpy()["s"][0]
        table = DeltaTable(f"{root}/ds/episodes")

        def rewrite() -> None:
            write_deltalake(table, table.to_pyarrow_dataset().to_table(), mode="overwrite")

        t_rewrite = timed(rewrite)
        print(f"{n} episodes x {T} steps = {steps} steps (returns sum read back via SQL: {check:.1f})")
        print(f"update all        {t_all:8.3f} s")
        print(f"update again      {t_again:8.3f} s")
        print(f"update 1%         {t_some:8.3f} s")
        print(f"rewrite table     {t_rewrite:8.3f} s")
        print(f"rewrite / update all: {t_rewrite / t_all:.1f}x   rewrite / update 1%: {t_rewrite / t_some:.1f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
