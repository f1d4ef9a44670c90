"""Actor of an online replay loop: writes episodes into a capacity dataset (FIFO eviction on).

usage: replay_actor.py PATH EPISODES COMMITTED_FILE
Capacity: 120 steps and 12 episodes; a commit every 2 episodes. After each
commit it appends one line to COMMITTED_FILE: ``k:length`` of each episode
that commit held and prints ``committed N`` on stdout;
``created`` once the dataset exists, ``done N VERSION`` at the end (VERSION:
the last commit's). After its first commit it waits for the learner's
``opened`` on the acknowledgement pipe, so the rest of its commits land while
the learner's stream exists, however fast either process runs. Episode k has
length ``2 + (3 k) % 9``; its values follow from k (``expected`` in replay_learner.py).
"""

from __future__ import annotations

import sys

import numpy as np
from pipe import ack_pipe

import episodelake as el

path, episodes, committed_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
schema = el.DatasetSchema(
    [
        el.FieldSpec("observation", (4,), "float32", storage="tensor"),
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("k", (), "int64", role="meta"),
    ]
)
ds = el.Dataset.create(schema, path, capacity={"steps": 120, "episodes": 12}, commit_episodes=2)
print("created", flush=True)
ack = ack_pipe("r")
version, pending, total, commits = ds.version, [], 0, 0
with open(committed_file, "w") as out:

    def record() -> None:
        global pending, total, commits
        out.write(" ".join(f"{k}:{n}" for k, n in pending) + "\n")
        out.flush()
        total += len(pending)
        pending = []
        commits += 1
        print(f"committed {total}", flush=True)
        if commits == 1:
            line = ack.readline()
            if not line.startswith("opened"):
                sys.exit(f"replay_actor: the learner ended before opening its stream ({line!r})")

    for k in range(episodes):
        length = 2 + (3 * k) % 9
        w = ds.new_episode(np.full(4, 100 * k, np.float32), k=k)
        for t in range(1, length + 1):
            w.add_step(
                {
                    "obs": np.full(4, 100 * k + t, np.float32),
                    "action": k,
                    "reward": k + t / 100,
                    "terminated": t == length,
                }
            )
        pending.append((k, length))
        if ds.version != version:  # this episode's finish committed every finished episode
            version = ds.version
            record()
    ds.flush()
    if pending:
        record()
print(f"done {total} {ds.version}", flush=True)
