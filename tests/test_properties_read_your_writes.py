"""Read-your-writes, stated over every public read entry point of ``Dataset``.

README: "Every read, query and sampler of a Dataset first commits the episodes
its own writers finished." ``tests/test_read_your_writes.py`` checks a list of
reads; this file states the property over the class itself: every public
method or property of ``Dataset`` is either a read checked here (or there), or
named below as not a read. A new entry point that is neither fails
``test_every_public_entry_point_is_classified`` until someone says which it is.
"""

from __future__ import annotations

import inspect

import pytest

import episodelake as el

from .test_read_your_writes import READS, SEED, record
from .workers.common import assert_all_match, crash_schema, episode

# Each read returns the number of distinct episodes it saw (3 were finished, none flushed).
MORE_READS = {
    "changes": lambda ds: len(ds.changes(0).added),
    "episode id": lambda ds: 3 if ds.episode(id=int(ds.snapshot().index["episode_id"][2])).length else -1,
    "to_numpy": lambda ds: len(ds.to_numpy()["episode_id"]),
    "positions": lambda ds: len(ds.positions),
    "trajectories": lambda ds: len({int(e) for e in ds.trajectories(64, seed=0).sample().episode_id}),
    "snapshot": lambda ds: ds.snapshot().num_episodes,
    "quality": lambda ds: ds.quality.check([el.Check("never", "false")])["never"].failed,
    "edit": lambda ds: len(ds.edit.trim(where="true", head=1, dry_run=True).episode_ids),
}
# Public names that are not reads of the episodes: writers, derived columns, constructors, plain attributes.
NOT_READS = {
    "append_episodes", "close", "columns", "create", "delete", "flush", "from_episodes", "info", "location",
    "new_episode", "open", "refresh", "schema", "vector_writer", "version",
}  # fmt: skip
# copy_to: tests/test_read_your_writes.py::test_copy_to_includes_the_writers_finished_episodes;
# to_ray / segments_to_ray: tests/test_ray.py (Ray is optional and slow to start).
COVERED_ELSEWHERE = {"copy_to", "to_ray", "segments_to_ray"}


def public_names() -> set[str]:
    return {name for name, _ in inspect.getmembers(el.Dataset) if not name.startswith("_")}


def test_every_public_entry_point_is_classified():
    checked = {name.split()[0] for name in READS} | set(MORE_READS)
    unclassified = public_names() - checked - NOT_READS - COVERED_ELSEWHERE
    assert not unclassified, f"entry points neither checked for read-your-writes nor named as non-reads: {unclassified}"


@pytest.mark.parametrize("read", list(MORE_READS))
def test_every_read_sees_the_writers_finished_episodes(tmp_path, read):
    ds = el.Dataset.create(crash_schema(), str(tmp_path / "ds"))
    record(ds, 3)  # finished, handed over, not flushed: the read must commit them first
    assert MORE_READS[read](ds) == 3
    assert_all_match(ds, [episode(SEED, i) for i in range(3)])
