"""Capacity datasets keep their table in small files, so that an eviction rewrites a small one.

An eviction rewrites the table file holding the oldest episodes without them.
A bulk import that filled the buffer in one file made every later eviction
rewrite the whole table (issue 25). The files are read here with pyarrow
straight from the table's directory (not through episodelake), and the live
episodes are checked against the plain-list FIFO model of
:mod:`tests.workers.replay`.
"""

from __future__ import annotations

import os
import tempfile

import pyarrow.parquet as pq
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .workers.replay import Fifo, check_episode, episode, live_numbers, schema

CAPACITY = 16 * 1024  # steps: one sixteenth, 1024 steps, is the file bound's floor
T = 64  # steps per episode


def files(path: str) -> list[tuple[int, int]]:
    """``(steps, bytes)`` of each file of the latest table version (steps: the sum of ``length``)."""
    out = []
    for uri in DeltaTable(os.path.join(path, "episodes")).file_uris():
        local = uri.removeprefix("file://")
        out.append((int(pq.read_table(local, columns=["length"])["length"].to_numpy().sum()), os.path.getsize(local)))
    return out


def test_a_bulk_import_fills_the_buffer_in_sixteen_files_and_evictions_keep_them_small(tmp_path):
    path = str(tmp_path / "buffer")
    ds = el.Dataset.create(schema(), path, capacity={"steps": CAPACITY, "vacuum_every": 10**6})
    model = Fifo(CAPACITY)
    n = CAPACITY // T
    ds.append_episodes(episode(k, T) for k in range(n))
    ds.flush()
    model.commit([(k, T) for k in range(n)])
    steps = [s for s, _ in files(path)]
    assert sum(steps) == CAPACITY and len(steps) >= 16
    assert max(steps) <= CAPACITY // 16 + T  # a batch closes at the episode reaching the bound
    for k in range(n, n + 12):  # single-episode commits, each evicting the oldest
        ds.append_episodes([episode(k, T)])
        ds.flush()
        model.commit([(k, T)])
    ds.maintenance.compact()
    steps, sizes = zip(*files(path), strict=True)
    assert sum(steps) == CAPACITY
    # compaction merges files up to 1/16 of the table's bytes (at least 64 KiB): whole files into a bin
    assert max(sizes) <= 2 * max(1 << 16, sum(sizes) // 16)
    assert len(sizes) >= sum(sizes) // (2 * max(1 << 16, sum(sizes) // 16))
    assert live_numbers(ds) == model.numbers
    for ref in [ds.episode(0), ds.episode(len(ds) // 2), ds.episode(len(ds) - 1)]:
        check_episode(ref)


def test_a_small_buffer_imports_in_one_commit(tmp_path):
    path = str(tmp_path / "small")
    ds = el.Dataset.create(schema(), path, capacity=500)
    before = ds.version
    ds.append_episodes(episode(k, 10) for k in range(60))  # 600 steps: the oldest 10 episodes never land
    ds.flush()
    model = Fifo(500)
    model.commit([(k, 10) for k in range(60)])
    assert ds.version == before + 1
    assert live_numbers(ds) == model.numbers


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 4)),
            st.tuples(st.just("delete"), st.integers(0, 3)),
            st.tuples(st.just("compact"), st.just(0)),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_a_snapshot_grown_past_evictions_deletes_and_compactions_reads_every_live_episode_exactly(tmp_path, ops):
    """Each read follows a commit that removed files; the snapshot keeps the rows of the files still there.

    Every live episode is read back after each operation and compared with
    its NumPy reference (``check_episode``: the table field ``state``, the
    action, the camera tensor), and the live set with the FIFO model.
    """
    path = tempfile.mkdtemp(dir=tmp_path)
    ds = el.Dataset.create(schema(), path, capacity=40, commit_episodes=10**6)
    model, n = Fifo(40), 0
    for op, k in ops:
        if op == "append":
            batch = [(n + i, 3 + (n + i) % 7) for i in range(k)]
            ds.append_episodes(episode(m, length) for m, length in batch)
            ds.flush()
            model.commit(batch)
            n += k
        elif op == "delete" and model.live:
            gone = model.live[k % len(model.live)][0]
            ds.delete(where="n = ?", params=[gone])
            model.live = [(m, length) for m, length in model.live if m != gone]
        elif op == "compact":
            ds.maintenance.compact()
        assert live_numbers(ds) == model.numbers
        for ref in ds.episodes():
            check_episode(ref)
