"""Reads commit first: every read of a writing Dataset sees the episodes its own writers finished.

Views stay pinned to their snapshot; another process sees new episodes only
once they are committed and it calls refresh() (checked in a real subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import episodelake as el
from episodelake.exporters import formats as exporters

from .workers.common import assert_all_match, crash_schema, episode, write_stepwise

ROOT = Path(__file__).resolve().parents[1]
SEED = 11


def segment_ids(ds: el.Dataset) -> set[int]:
    stream = ds.segment_stream(1, batch_size=4, sampler=el.Sequential(), prefetch=0)
    try:
        return {int(i) for batch in stream for i in batch.episode_id}
    finally:
        stream.close()


def parquet_rows(ds: el.Dataset) -> int:
    out = Path(ds.location.path).with_suffix(".parquet")
    exporters.to_parquet(ds, out)
    return pq.read_table(out).num_rows


# Each read returns the number of distinct episodes it saw.
READS = {
    "episode": lambda ds: ds.episode(2).length and 3,
    "len": len,
    "num_steps": lambda ds: 3 if ds.num_steps == sum(episode(SEED, i).length for i in range(3)) else -1,
    "episodes": lambda ds: len(list(ds.episodes())),
    "episode_ids": lambda ds: len(set(ds.episode_ids.tolist())),
    "sql": lambda ds: ds.sql("SELECT count(*) FROM episodes").fetchall()[0][0],
    "sql fetchnumpy": lambda ds: len(ds.sql("SELECT episode_id FROM episodes").fetchnumpy()["episode_id"]),
    "steps view": lambda ds: ds.sql("SELECT count(DISTINCT episode_id) FROM steps").fetchall()[0][0],
    "where": lambda ds: len(ds.where("length > 0")),
    "stats": lambda ds: ds.stats()["length"]["count"],
    "segments": lambda ds: len({int(ds.segments(1)[i].episode_id) for i in range(len(ds.segments(1)))}),
    "segment_stream": lambda ds: len(segment_ids(ds)),
    "sample_transitions": lambda ds: 3 if len(ds.sample_transitions(8, seed=0).reward) == 8 else -1,
    "sql to_arrow_table": lambda ds: ds.sql("SELECT episode_id FROM episodes").to_arrow_table().num_rows,
    "select_episodes": lambda ds: len(ds.select_episodes("SELECT episode_id FROM episodes")),
    "episode_table": lambda ds: exporters.episode_table(ds).num_rows,
    "to_parquet": lambda ds: parquet_rows(ds),
    "maintenance validate": lambda ds: ds.maintenance.validate().episodes,
    "history": lambda ds: sum(h.get("operationMetrics", {}).get("num_added_rows", 0) for h in ds.history()),
}


def record(ds: el.Dataset, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        write_stepwise(ds, episode(SEED, i))


@pytest.mark.parametrize("read", list(READS))
def test_every_read_sees_the_writers_finished_episodes(tmp_path, read):
    ds = el.Dataset.create(crash_schema(), str(tmp_path / "ds"))
    record(ds, 3)  # no flush; 64 episodes would trigger a commit
    assert READS[read](ds) == 3
    assert_all_match(ds, [episode(SEED, i) for i in range(3)])


def test_copy_to_includes_the_writers_finished_episodes(tmp_path):
    ds = el.Dataset.create(crash_schema(), str(tmp_path / "ds"))
    record(ds, 3)
    assert_all_match(ds.copy_to(str(tmp_path / "copy")), [episode(SEED, i) for i in range(3)])


def test_views_stay_pinned_while_the_dataset_moves_on(tmp_path):
    ds = el.Dataset.create(crash_schema(), str(tmp_path / "ds"))
    record(ds, 2)
    view = ds.where("true")
    record(ds, 1, first=2)
    assert (len(view), len(view.where("true")), len(ds)) == (2, 2, 3)
    assert view.version < ds.version


def test_a_read_commits_no_episode_that_is_still_running_or_held(tmp_path):
    schema = el.DatasetSchema(
        [
            f if f.name != "success" else el.FieldSpec("success", (), "bool", role="meta", required=True)
            for f in crash_schema()
        ]
    )
    ds = el.Dataset.create(schema, str(tmp_path / "ds"))
    raw = episode(SEED, 0)
    w = ds.new_episode({k: v[0] for k, v in raw.obs.items()}, task="pick")
    step = {"observations": {k: v[1] for k, v in raw.obs.items()}, "actions": 1, "rewards": 0.5}
    w.add_step(step)
    assert len(ds) == 0
    w.add_step({**step, "terminated": True})
    assert w.awaiting_meta == ("success",) and len(ds) == 0
    w.meta["success"] = True
    assert len(ds) == 1
    assert ds.sql("SELECT success, length FROM episodes").fetchall() == [(True, 2)]


READER = """
import sys, episodelake as el
ds = el.Dataset.open(sys.argv[1], read_only=True)
for line in sys.stdin:
    if line.strip() == "refresh":
        ds.refresh()
    print(len(ds), ds.sql("SELECT count(*) FROM episodes").fetchall()[0][0], flush=True)
"""


def test_another_process_sees_only_committed_episodes_after_refresh(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(crash_schema(), path)
    record(ds, 2)
    ds.flush()
    record(ds, 3, first=2)  # finished, not committed
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    def ask(command: str) -> str:
        reader.stdin.write(command + "\n")
        reader.stdin.flush()
        return reader.stdout.readline().strip()

    try:
        assert ask("count") == "2 2"  # opened before the commit: committed episodes only
        assert len(ds) == 5  # this read commits the writer's three
        assert ask("count") == "2 2"  # still pinned to the version it opened
        assert ask("refresh") == "5 5"
    finally:
        reader.stdin.close()
        assert reader.wait(timeout=600) == 0
    assert_all_match(el.Dataset.open(path), [episode(SEED, i) for i in range(5)])
    np.testing.assert_array_equal(ds.episode_ids, el.Dataset.open(path).episode_ids)


def test_reads_in_another_thread_commit_without_losing_or_repeating_episodes(tmp_path):
    # An actor thread records while this thread keeps reading (each read may commit): every finished
    # episode ends up committed exactly once, in order.
    import threading

    ds = el.Dataset.create(crash_schema(), str(tmp_path / "ds"))
    actor = threading.Thread(target=record, args=(ds, 150))
    actor.start()
    reads = 0
    while actor.is_alive():
        seen = len(ds)
        assert seen <= 150
        reads += 1
    actor.join()
    assert reads > 0
    assert_all_match(ds, [episode(SEED, i) for i in range(150)])
