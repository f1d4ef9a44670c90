"""TorchRL slice sampling: episodelake EpisodeStorage + SliceSampler vs TorchRL LazyMemmapStorage + SliceSampler.

    .venv/bin/python benchmarks/bench_torchrl.py                      # 10^5 transitions, a few seconds
    .venv/bin/python benchmarks/bench_torchrl.py --sizes 1e4,1e5,1e6  # how it scales with the dataset size

The same episodes (state 17 x float32, action 6 x float32, scalar reward,
lengths 50..300, a third terminated, a third truncated) go into an
episodelake dataset on local disk and into TorchRL's ``LazyMemmapStorage``
(a flat TensorDict with ``("collector", "traj_ids")``). Both buffers are
``TensorDictReplayBuffer``s sampling ``--batch`` transitions as slices of
``--slice-len`` that never cross an episode, returning TensorDicts with the
same keys. TorchRL's sampler runs as configured by default (trajectory
boundaries recomputed per sample) and with ``cache_values=True`` (its
fastest setting for a storage that does not change). Rows alternate between
the loaders (best of ``--rounds``), so load on a shared machine hits both;
the load average is printed before and after. Transitions per second.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import episodelake as el


def episodes(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < n:
        T = int(min(rng.integers(50, 300), max(n - total, 2)))
        flag = int(rng.integers(0, 3))
        out.append(
            {
                "observations": rng.standard_normal((T + 1, 17), dtype=np.float32),
                "actions": rng.standard_normal((T, 6), dtype=np.float32),
                "rewards": rng.standard_normal(T, dtype=np.float32),
                "terminated": flag == 1,
                "truncated": flag == 2,
            }
        )
        total += T
    return out


def episodelake_buffer(eps: list[dict], path: str, batch: int, slice_len: int):
    from episodelake.integrations.torchrl import replay_buffer

    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (17,), "float32"),
            el.FieldSpec("action", (6,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.from_episodes(eps, path, schema=schema)
    return replay_buffer(el.Dataset.open(path), batch_size=batch, slice_len=slice_len, seed=0), ds


def torchrl_buffer(eps: list[dict], scratch: str, batch: int, slice_len: int, cache: bool):
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, SliceSampler, TensorDictReplayBuffer

    n = sum(len(e["rewards"]) for e in eps)
    obs = np.concatenate([e["observations"][:-1] for e in eps])
    nxt = np.concatenate([e["observations"][1:] for e in eps])
    term = np.concatenate([np.eye(1, len(e["rewards"]), len(e["rewards"]) - 1, bool)[0] & e["terminated"] for e in eps])
    trunc = np.concatenate([np.eye(1, len(e["rewards"]), len(e["rewards"]) - 1, bool)[0] & e["truncated"] for e in eps])
    traj = np.concatenate([np.full(len(e["rewards"]), i, np.int64) for i, e in enumerate(eps)])
    td = TensorDict(
        {
            "observation": torch.from_numpy(obs),
            "action": torch.from_numpy(np.concatenate([e["actions"] for e in eps])),
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "terminated": torch.zeros(n, 1, dtype=torch.bool),
            "truncated": torch.zeros(n, 1, dtype=torch.bool),
            "collector": {"traj_ids": torch.from_numpy(traj)},
            "next": {
                "observation": torch.from_numpy(nxt),
                "reward": torch.from_numpy(np.concatenate([e["rewards"] for e in eps])).unsqueeze(-1),
                "terminated": torch.from_numpy(term).unsqueeze(-1),
                "truncated": torch.from_numpy(trunc).unsqueeze(-1),
                "done": torch.from_numpy(term | trunc).unsqueeze(-1),
            },
        },
        batch_size=[n],
    )
    rb = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(n, scratch_dir=scratch),
        sampler=SliceSampler(slice_len=slice_len, traj_key=("collector", "traj_ids"), cache_values=cache),
        batch_size=batch,
    )
    rb.extend(td)
    return rb


def rate(rb, batches: int, batch: int) -> float:
    rb.sample()  # warm: caches, first reads
    t0 = time.perf_counter()
    for _ in range(batches):
        rb.sample()
    return batches * batch / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e5", help="comma-separated transition counts")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--slice-len", type=int, default=32)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"batch {args.batch} transitions = slices of {args.slice_len}; {os.cpu_count()} CPUs; torch threads 1")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for size in (int(float(s)) for s in args.sizes.split(",")):
        eps = episodes(size)
        with tempfile.TemporaryDirectory() as tmp:
            ours, _ = episodelake_buffer(eps, os.path.join(tmp, "ds"), args.batch, args.slice_len)
            rows = {
                "episodelake EpisodeStorage + SliceSampler": ours,
                "torchrl LazyMemmapStorage + SliceSampler": torchrl_buffer(
                    eps, os.path.join(tmp, "m1"), args.batch, args.slice_len, False
                ),
                "torchrl LazyMemmapStorage + SliceSampler(cache_values=True)": torchrl_buffer(
                    eps, os.path.join(tmp, "m2"), args.batch, args.slice_len, True
                ),
            }
            best = dict.fromkeys(rows, 0.0)
            for _ in range(args.rounds):
                for name, rb in rows.items():
                    best[name] = max(best[name], rate(rb, args.batches, args.batch))
            n = sum(len(e["rewards"]) for e in eps)
            print(f"\n{n:,} transitions in {len(eps):,} episodes")
            base = best["episodelake EpisodeStorage + SliceSampler"]
            for name, value in best.items():
                print(f"  {name:<62} {value:>12,.0f} transitions/s   episodelake x{base / value:.2f}")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
