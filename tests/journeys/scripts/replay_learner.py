"""Learner of an online replay loop: prioritized sampling, priority updates and refreshes while the actor writes.

usage: replay_learner.py PATH < actor's stdout
Reads the actor's messages (``created``, ``committed N``, ``done N VERSION``)
from stdin. It opens its prioritized stream once the first commit is there
and tells the actor ``opened VERSION`` on the acknowledgement pipe; then,
taking one message per round without blocking on them, it refreshes the
stream, samples, checks every sampled segment against what the actor wrote
(never a partial episode) and sets new priorities. After ``done`` it
refreshes once more, so the stream ends at the actor's last version. Prints
JSON counts.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from pipe import Lines, ack_pipe

import episodelake as el


def expected(k: int) -> np.ndarray:
    """Episode k's observation values per row, as the actor wrote them."""
    return 100 * k + np.arange(2 + (3 * k) % 9 + 1, dtype=np.float32)


def check(batch: el.Batch) -> None:
    for b in range(len(batch.episode_id)):
        values = expected(int(batch.meta["k"][b]))
        rows = batch.start[b] + np.arange(2)
        assert (batch.obs[b] == values[rows][:, None]).all(), f"segment of episode k={batch.meta['k'][b]} differs"


messages = Lines(sys.stdin.fileno())
assert messages.next(block=True) == "created"
first = messages.next(block=True)
assert first is not None and first.startswith("committed"), first
ds = el.Dataset.open(sys.argv[1], read_only=True)
stream = ds.segment_stream(el.Window(2, pad=None), batch_size=16, seed=0, sampler=el.Prioritized(1.0, alpha=0.6))
opened = stream.version
ack_pipe("w").write(f"opened {opened}\n")
batches = refreshes = versions = 0
done: tuple[int, int] | None = None
rng = np.random.default_rng(0)
while done is None:
    line = messages.next(block=False)
    if line is None and messages.eof:
        sys.exit("replay_learner: the actor ended without 'done'")
    if line is not None and line.startswith("done"):
        done = (int(line.split()[1]), int(line.split()[2]))
    versions += stream.refresh()
    refreshes += 1
    batch = stream.sample()
    check(batch)
    stream.update_priorities(batch.indices, np.abs(rng.standard_normal(len(batch.indices))) + 0.01)
    batches += 1
versions += stream.refresh()  # the actor committed everything before 'done': this reaches its last version
check(stream.sample())
result = {"batches": batches, "refreshes": refreshes, "new_versions": versions, "version": stream.version}
print(json.dumps({**result, "opened": opened, "actor_version": done[1]}))
