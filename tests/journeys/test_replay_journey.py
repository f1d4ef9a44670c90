"""Journey: an online replay loop in two processes (actor writes with eviction, learner samples by priority).

Checked by exit statuses and by what is on disk afterwards, against a FIFO
model of what the actor says it committed (computed here, independently).
"""

from __future__ import annotations

import numpy as np

import episodelake as el

from .pipeline import actor_into_learner

STEPS, EPISODES = 120, 12  # the actor's capacity


def fifo_model(committed: list[list[tuple[int, int]]]) -> list[int]:
    """The episodes (k) live after these commits: each commit adds its episodes, then the oldest go until it fits."""
    live: list[tuple[int, int]] = []
    for commit in committed:
        live += commit
        while sum(n for _, n in live) > STEPS or len(live) > EPISODES:
            live.pop(0)
    return [k for k, _ in live]


def test_actor_with_eviction_and_prioritized_learner(tmp_path):
    n = 60
    actor = ["replay_actor.py", "ds", str(n), "committed.txt"]
    result = actor_into_learner(tmp_path, actor, ["replay_learner.py", "ds"])
    # the actor went on committing only after the learner's stream was open (a message, not a race), and the
    # learner's last refresh came after the actor's last commit: the stream took in new versions, up to the last
    assert result["opened"] < result["actor_version"] == result["version"]
    assert result["batches"] > 0 and result["new_versions"] >= 1

    # what the actor committed: one line per commit, ``k:length`` per episode
    text = (tmp_path / "committed.txt").read_text().splitlines()
    commits = [[tuple(map(int, item.split(":"))) for item in line.split()] for line in text]
    assert [k for c in commits for k, _ in c] == list(range(n))  # every episode committed once, in order
    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert result["version"] <= ds.version
    model = fifo_model(commits)
    live = [int(k) for k in ds.sql("SELECT k FROM episodes ORDER BY created_at, episode_id").fetchnumpy()["k"]]
    assert live == model
    for ep in ds.episodes():  # every live episode whole, as written
        k = int(ep.meta["k"])
        assert ep.length == 2 + (3 * k) % 9
        np.testing.assert_array_equal(ep.read().all_obs[:, 0], 100 * k + np.arange(ep.length + 1))
    assert ds.num_steps <= STEPS and len(ds) <= EPISODES
    assert ds.maintenance.validate().ok
