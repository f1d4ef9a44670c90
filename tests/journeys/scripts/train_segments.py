"""Train a small torch model on segments of a dataset through a DataLoader with 2 forked workers.

usage: train_segments.py PATH [--options JSON] [--steps N] [--workers W]
Prints JSON: steps, first and last losses (averaged over 20 steps).
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from torch.utils.data import DataLoader

import episodelake as el
from episodelake.integrations.torch import to_torch

p = argparse.ArgumentParser()
p.add_argument("path")
p.add_argument("--options", default=None)
p.add_argument("--steps", type=int, default=300)
p.add_argument("--workers", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)

ds = el.Dataset.open(args.path, storage_options=json.loads(args.options) if args.options else None, read_only=True)
segs = ds.segments(4)
loader = DataLoader(
    segs,
    batch_size=16,
    shuffle=True,
    num_workers=args.workers,
    collate_fn=segs.collate,
    multiprocessing_context="fork",
    persistent_workers=True,
)
# Predict each step's reward_dist (info recorded per step) from its observation image.
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 1)
)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
losses: list[float] = []
while len(losses) < args.steps:
    for batch in loader:
        tb = to_torch(batch)
        x = tb.obs.flatten(0, 1).float() / 255.0  # [B * L, 3, 32, 32]
        y = tb.extra.flatten(0, 1).float()  # the one extra field reads as its array
        keep = tb.mask.flatten(0, 1)
        loss = ((model(x).squeeze(-1) - y) ** 2)[keep].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if len(losses) == args.steps:
            break
first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
assert all(math.isfinite(v) for v in losses), "non-finite loss"
print(json.dumps({"steps": len(losses), "first": first, "last": last}))
