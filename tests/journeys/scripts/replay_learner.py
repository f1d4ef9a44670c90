"""Learner of an online replay loop: prioritized sampling, priority updates and refreshes while the actor writes.

usage: replay_learner.py PATH < actor's stdout
Reads the actor's messages (``created``, ``committed N``, ``done N``) from
stdin without blocking on them; between them it refreshes its prioritized
stream, samples, checks every sampled segment against what the actor wrote
(never a partial episode) and sets new priorities. Prints JSON counts.
"""

from __future__ import annotations

import json
import select
import sys

import numpy as np

import episodelake as el


def expected(k: int) -> np.ndarray:
    """Episode k's observation values per row, as the actor wrote them."""
    return 100 * k + np.arange(2 + (3 * k) % 9 + 1, dtype=np.float32)


line = sys.stdin.readline().strip()
assert line == "created", line
stream = None
batches = refreshes = versions = 0
done = None
rng = np.random.default_rng(0)
while True:
    if done is None and select.select([sys.stdin], [], [], 0.01)[0]:  # waits on the pipe, not a sleep
        word, n = sys.stdin.readline().split()
        done = int(n) if word == "done" else None
    if stream is None:
        ds = el.Dataset.open(sys.argv[1], read_only=True)
        if not len(ds):
            continue
        stream = ds.segment_stream(sequence_length=2, batch_size=16, seed=0, pad=None, priority=1.0, alpha=0.6)
    else:
        versions += stream.refresh()
        refreshes += 1
    batch = stream.sample()
    for b in range(len(batch.episode_id)):
        values = expected(int(batch.meta["k"][b]))
        rows = batch.start[b] + np.arange(2)
        assert (batch.obs[b] == values[rows][:, None]).all(), f"segment of episode k={batch.meta['k'][b]} differs"
    stream.update_priorities(batch.indices, np.abs(rng.standard_normal(len(batch.indices))) + 0.01)
    batches += 1
    if done is not None and (batches > 5 or stream.refresh() is False):
        stream.refresh()
        break
print(json.dumps({"batches": batches, "refreshes": refreshes, "new_versions": versions, "version": stream.version}))
