"""DDP training (torch.distributed, gloo, CPU) over a sharded finite segment stream; save and resume its state.

usage: ddp_train.py PATH OUT_DIR --world W --phase full|resume [--epochs 2] [--save-at K]

``full``: train ``epochs`` passes; after batch K of the last pass every rank
writes its stream state to OUT_DIR/state-rank<r>.json. ``resume``: a fresh
run loads rank 0's saved state on every rank (a finite pass's state is global)
and finishes that pass. Each rank logs its batches (epoch, episode ids,
starts) to OUT_DIR/<phase>-rank<r>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import episodelake as el
from episodelake.integrations.torch import to_torch


def stream_for(ds: el.Dataset, rank: int, world: int):
    return ds.segment_stream(4, batch_size=3, sampler=el.Uniform(replacement=False), seed=7, shard=(rank, world))


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.world, timeout=timedelta(seconds=600)
    )
    torch.manual_seed(0)
    ds = el.Dataset.open(args.path, read_only=True)
    stream = stream_for(ds, rank, args.world)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    log = []

    def train(epoch: int, batch) -> None:
        tb = to_torch(batch)
        loss = ((model(tb.obs.float()).squeeze(-1) - tb.reward.float()) ** 2)[tb.mask].mean()
        opt.zero_grad()
        loss.backward()  # all-reduce: a rank with fewer batches would leave the others waiting here
        opt.step()
        log.append({"epoch": epoch, "ids": batch.episode_id.tolist(), "starts": batch.start.tolist()})

    if args.phase == "full":
        for epoch in range(args.epochs):
            for i, batch in enumerate(stream):
                train(epoch, batch)
                if epoch == args.epochs - 1 and i + 1 == args.save_at:
                    with open(os.path.join(args.out, f"state-rank{rank}.json"), "w") as f:
                        json.dump(stream.state_dict(), f)
    else:
        with open(os.path.join(args.out, "state-rank0.json")) as f:
            state = json.load(f)
        stream.load_state_dict(state)
        for batch in stream:
            train(state["epoch"], batch)
    stream.close()
    with open(os.path.join(args.out, f"{args.phase}-rank{rank}.json"), "w") as f:
        json.dump(log, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("out")
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--phase", choices=["full", "resume"], required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--save-at", type=int, default=2)
    args = p.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.world, join=True)
    print(json.dumps({"phase": args.phase, "world": args.world}))
