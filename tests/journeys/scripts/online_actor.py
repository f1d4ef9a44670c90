"""Actor of an online loop: records episodes, committing every few, and reports each commit on stdout.

usage: online_actor.py PATH EPISODES
stdout lines: ``created`` once the dataset exists, ``committed N`` after each commit
(N episodes are then in the table), ``done N`` at the end. Episode k has
length ``3 + (5 k) % 7``; its values follow from k (see ``expected`` in online_learner.py).
"""

from __future__ import annotations

import sys

import numpy as np

import episodelake as el

path, episodes = sys.argv[1], int(sys.argv[2])
schema = el.DatasetSchema(
    [
        el.FieldSpec("observation", (3, 16, 16), "uint8", layout="CHW", storage="tensor"),
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("k", (), "int64", role="meta"),
    ]
)
ds = el.Dataset.create(schema, path, commit_episodes=3)
print("created", flush=True)
version = ds.version
for k in range(episodes):
    length = 3 + (5 * k) % 7
    w = ds.new_episode(np.full((3, 16, 16), (11 * k) % 256, np.uint8), k=k)
    for t in range(1, length + 1):
        obs = np.full((3, 16, 16), (11 * k + t) % 256, np.uint8)
        w.add_step({"obs": obs, "action": k, "reward": k + t / 1000, "truncated": t == length})
    if ds.version != version:  # this episode's finish committed every finished episode
        version = ds.version
        print(f"committed {k + 1}", flush=True)
ds.flush()
print(f"done {episodes}", flush=True)
