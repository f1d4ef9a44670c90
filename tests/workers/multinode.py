"""One rank of the many-nodes test: ``python -m tests.workers.multinode RANK CONFIG_JSON``.

Joins a ``torch.distributed`` gloo group (``config["init_method"]``, world
``config["world"]``), opens the dataset on S3 with its own disk cache
(``OUT/cache-RANK``) and streams its shard of
``segment_stream(L, sampler=el.Uniform(replacement=False), shard=(rank, world))``:

* phase ``first``: all of epoch 0, then ``config["resume_after"]`` batches of
  epoch 1; then saves ``state_dict()`` to ``state-RANK.json``;
* phase ``resume``: a fresh stream loads that state and reads the rest of
  epoch 1.

Every batch is written to ``OUT/PHASE-RANK-NNN.npz`` (epoch, episode ids,
starts, camera, reward, mask). The ranks check through the group that they
read the same number of batches (exit 3 otherwise).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import episodelake as el


def main(rank: int, config: dict) -> int:
    torch.set_num_threads(1)
    world = config["world"]
    dist.init_process_group("gloo", init_method=config["init_method"], rank=rank, world_size=world)
    ds = el.Dataset.open(
        config["url"],
        storage_options=config["storage_options"],
        read_only=True,
        cache_dir=os.path.join(config["out"], f"cache-{rank}"),  # a node's disk cache: each rank is a node here
    )
    stream = ds.segment_stream(
        config["L"],
        batch_size=config["B"],
        seed=config["seed"],
        sampler=el.Uniform(replacement=False),
        shard=(rank, world),
    )
    out, phase = config["out"], config["phase"]
    state_path = os.path.join(out, f"state-{rank}.json")
    written = 0

    def record(batch: el.Batch, epoch: int) -> None:
        nonlocal written
        np.savez(
            os.path.join(out, f"{phase}-{rank}-{written:03d}.npz"),
            epoch=epoch,
            episode_id=batch.episode_id,
            start=batch.start,
            camera=batch.all_obs["camera"],
            reward=batch.reward,
            mask=batch.mask,
        )
        written += 1

    if phase == "first":
        for batch in stream:
            record(batch, stream.epoch)
        iterator = iter(stream)  # the next pass: epoch 1
        for _ in range(config["resume_after"]):
            record(next(iterator), stream.epoch)
        state = stream.state_dict()
        stream.close()
        with open(state_path, "w") as fh:
            json.dump(state, fh)
    else:
        with open(state_path) as fh:
            stream.load_state_dict(json.load(fh))
        for batch in stream:
            record(batch, stream.epoch)
    counts = torch.tensor([written, -written])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if int(counts[0]) == written == -int(counts[1]) else 3


if __name__ == "__main__":
    with open(sys.argv[2]) as fh:
        sys.exit(main(int(sys.argv[1]), json.load(fh)))
