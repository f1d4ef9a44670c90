"""Learner of an online loop: samples while the actor records, refreshing to see new commits.

usage: online_learner.py PATH < actor's stdout
Reads the actor's messages from stdin (``created``, ``committed N``, ``done N``) without
blocking on them, refreshes, checks every episode it sees in full against what
the actor wrote (never a partial one) and samples batches. Prints JSON counts.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from pipe import Lines

import episodelake as el


def expected(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Episode k's observation values per row and rewards, as the actor wrote them."""
    length = 3 + (5 * k) % 7
    t = np.arange(length + 1)
    return (11 * k + t) % 256, (k + t[1:] / 1000).astype(np.float32)


messages = Lines(sys.stdin.fileno())
assert messages.next(block=True) == "created"
ds = el.Dataset.open(sys.argv[1], read_only=True)
verified: set[int] = set()
refreshes = batches = 0
committed, done = 0, None
while True:
    line = None if done is not None else messages.next(block=False)  # one message per round, if one came
    if line is None and messages.eof and done is None:
        sys.exit("online_learner: the actor ended without 'done'")
    if line is not None:
        word, n = line.split()
        if word == "committed":
            committed = int(n)
        else:
            done = int(n)
    ds.refresh()
    refreshes += 1
    assert len(ds) >= committed, f"the actor committed {committed} episodes, the learner sees {len(ds)}"
    for ep in ds.episodes():
        if ep.episode_id in verified:
            continue
        obs_values, rewards = expected(int(ep.meta["k"]))
        seg = ep.read()
        assert ep.length == len(rewards), f"episode k={ep.meta['k']} has {ep.length} steps of {len(rewards)}"
        np.testing.assert_array_equal(seg.all_obs, np.broadcast_to(obs_values[:, None, None, None], seg.all_obs.shape))
        np.testing.assert_array_equal(seg.reward, rewards)
        assert seg.truncated[-1] and not seg.truncated[:-1].any()
        verified.add(ep.episode_id)
    if len(ds):
        batch = ds.segment_stream(2, batch_size=4, seed=batches, prefetch=0).sample()
        for b in range(4):
            values, _ = expected(int(batch.meta["k"][b]))
            rows = batch.start[b] + np.arange(2)
            valid = batch.mask[b]
            assert (batch.obs[b][valid] == values[rows][valid][:, None, None, None]).all()
        batches += 1
    if done is not None and len(ds) == done:
        break
print(json.dumps({"episodes": len(ds), "verified": len(verified), "refreshes": refreshes, "batches": batches}))
