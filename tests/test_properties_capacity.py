"""Capacity eviction with several writers (issue 39): oldest-first by commit order, whatever wrote each episode.

Each writer (a ``Dataset`` object, or a process) owns a random writer number
and its episode ids are ``number << 32 | sequence``, so with two writers the
ids are not in commit order: a writer with a low number commits episodes
with lower ids later. Every episode here is handed over and committed by the
same ``flush()``, so its commit order is its episode order (``created_at``).
The reference is :class:`tests.workers.replay.Fifo`, a plain list in commit
order that drops its oldest entries while over capacity.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .workers.replay import Fifo, check_episode, episode, length_of, live_numbers, schema

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(el.__file__).resolve().parents[1]  # the library this test imported (a mutated copy's, in a mutation run)


def commit(ds: el.Dataset, model: Fifo, batch: list[tuple[int, int]]) -> None:
    ds.append_episodes(episode(n, length) for n, length in batch)
    ds.flush()
    model.commit(batch)


def ids_in_commit_order_are_not_sorted(path: str, numbers: list[int]) -> bool:
    """Whether the live episodes' ids, in commit order, are out of id order (the case the test is about)."""
    by_number = {int(e.meta["n"]): int(e.episode_id) for e in el.Dataset.open(path).episodes()}
    ids = [by_number[n] for n in numbers]
    return ids != sorted(ids)


def test_two_writers_interleaving_evict_oldest_first(tmp_path):
    """Kills "capacity eviction ordered by id before time": A, B, A, B, ... one episode a commit."""
    path = str(tmp_path / "ds")
    a = el.Dataset.create(schema(), path, capacity={"episodes": 4}, commit_episodes=10**6)
    b = el.Dataset.open(path, commit_episodes=10**6)
    model = Fifo(episodes=4)
    for n in range(10):
        commit(a if n % 2 == 0 else b, model, [(n, 3)])
        assert live_numbers(el.Dataset.open(path)) == model.numbers, n
    assert model.numbers == [6, 7, 8, 9]
    assert ids_in_commit_order_are_not_sorted(path, model.numbers)  # the writers' ids interleave either way
    for ref in el.Dataset.open(path).episodes():
        check_episode(ref)


def test_a_writer_process_between_two_local_writers_evicts_oldest_first(tmp_path):
    """Three writers, one of them another process (its own writer number), by steps: FIFO in commit order."""
    path = str(tmp_path / "ds")
    a = el.Dataset.create(schema(), path, capacity={"steps": 30}, commit_episodes=10**6)
    b = el.Dataset.open(path, commit_episodes=10**6)
    model = Fifo(steps=30)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(ROOT)])}
    n = 0
    for round_ in range(2):
        for ds in (a, b):
            commit(ds, model, [(n, length_of(n)), (n + 1, length_of(n + 1))])
            n += 2
        # the worker appends episodes n, n + 1, n + 2 (lengths length_of), one commit each
        cmd = [sys.executable, "-m", "tests.workers.replay", "write", path, str(n), "3", "1"]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        for k in range(n, n + 3):
            model.commit([(k, length_of(k))])
        n += 3
        assert live_numbers(el.Dataset.open(path)) == model.numbers, round_
    assert len(model.numbers) >= 4
    reopened = el.Dataset.open(path)
    assert reopened.num_steps <= 30 and reopened.maintenance.validate().ok


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 1), st.lists(st.integers(1, 6), min_size=1, max_size=3)), min_size=2, max_size=10
    ),
    steps=st.one_of(st.none(), st.integers(4, 20)),
    episodes=st.one_of(st.none(), st.integers(1, 5)),
)
def test_interleaved_writers_follow_the_fifo_model(tmp_path, plan, steps, episodes):
    """Any interleaving of two writers' commits (each of 1-3 episodes): the live episodes are the FIFO model's."""
    if steps is None and episodes is None:
        episodes = 3
    path = tempfile.mkdtemp(dir=tmp_path)
    capacity = {"steps": steps, "episodes": episodes}
    writers = [el.Dataset.create(schema(), path, capacity=capacity, commit_episodes=10**6)]
    writers.append(el.Dataset.open(path, commit_episodes=10**6))
    model = Fifo(steps, episodes)
    n = 0
    for who, lengths in plan:
        commit(writers[who], model, [(n + i, length) for i, length in enumerate(lengths)])
        n += len(lengths)
    final = el.Dataset.open(path)
    assert live_numbers(final) == model.numbers
    assert final.num_steps == sum(length for _, length in model.live)


@pytest.mark.parametrize("first", ["a", "b"])
def test_the_writer_that_commits_second_loses_its_episodes_last(tmp_path, first):
    """Whichever writer has the lower number: a full buffer evicts the episode committed first."""
    path = str(tmp_path / "ds")
    a = el.Dataset.create(schema(), path, capacity={"episodes": 2}, commit_episodes=10**6)
    b = el.Dataset.open(path, commit_episodes=10**6)
    order = (a, b) if first == "a" else (b, a)
    model = Fifo(episodes=2)
    commit(order[0], model, [(0, 2)])
    commit(order[1], model, [(1, 2)])
    commit(order[0], model, [(2, 2)])  # evicts episode 0 (the oldest), whatever the ids say
    assert live_numbers(el.Dataset.open(path)) == model.numbers == [1, 2]
    commit(order[1], model, [(3, 2)])
    assert live_numbers(el.Dataset.open(path)) == model.numbers == [2, 3]
