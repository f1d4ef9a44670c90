"""A learner that keeps up: ``stream.refresh()`` / ``follow=True`` and background compaction.

References are built independently: segment counts from the lengths as
written (``T - L + 1`` per episode), a stream built fresh at the newer version,
and ``p ** alpha / sum(p ** alpha)`` over priorities tracked here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.growable import append_rows
from episodelake.storage import layout
from episodelake.storage import table as table_mod

L = 2
ALPHA = 0.5


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("observation", (3,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def length_of(k: int) -> int:
    return 2 + (3 * k) % 5


def episode(k: int) -> dict:
    T = length_of(k)
    return {
        "observations": np.full((T + 1, 3), k, np.float32),
        "actions": np.arange(T) + 1000 * k,
        "rewards": np.full(T, k, np.float32),
        "terminated": True,
    }


def write(ds: el.Dataset, ks) -> None:
    ds.append_episodes(episode(k) for k in ks)
    ds.flush()


def segments_of(ks) -> int:
    """Segments of length L over episodes ks, counted from the lengths as written."""
    return sum(length_of(k) - L + 1 for k in ks)


@pytest.fixture(params=["disk", "s3"])
def pair(request, tmp_path):
    """A writer and a learner (a second Dataset object on the same path), 10 episodes committed."""
    if request.param == "s3":
        url = request.getfixturevalue("s3_url")
        opts = request.getfixturevalue("s3_server").storage_options
    else:
        url, opts = str(tmp_path / "ds"), None
    writer = el.Dataset.create(schema(), url, storage_options=opts)
    write(writer, range(10))
    return writer, el.Dataset.open(url, storage_options=opts)


def reopen(ds: el.Dataset) -> el.Dataset:
    """The same dataset opened again (a fresh object at the latest version)."""
    return el.Dataset.open(ds.location.url, storage_options=ds.location.storage_options)


def keys(batch) -> list[tuple[int, int]]:
    return list(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True))


def test_refresh_takes_in_new_episodes_and_equals_a_fresh_stream(pair):
    writer, learner = pair
    stream = learner.segment_stream(L, batch_size=16, seed=3)
    for _ in range(3):
        stream.sample()
    assert stream.refresh() is False  # nothing new: nothing changes
    write(writer, range(10, 15))
    assert stream.refresh() is True
    assert len(stream.index) == segments_of(range(15))
    state = stream.state_dict()
    assert state["version"] == writer.version == stream.version
    fresh = reopen(learner).segment_stream(L, batch_size=16, seed=3)
    fresh.load_state_dict(state)  # same episodes, same fingerprint: an extended index equals a built one
    for _ in range(5):
        mine, theirs = stream.sample(), fresh.sample()
        assert keys(mine) == keys(theirs)
        np.testing.assert_array_equal(mine.obs, theirs.obs)  # rows of grown columns read as a full read does
        np.testing.assert_array_equal(mine.action, theirs.action)
        k = mine.obs[:, :1, 0].astype(np.int64)  # episode k's observations all hold k, its actions t + 1000 k
        np.testing.assert_array_equal(mine.action, mine.start[:, None] + np.arange(L) + 1000 * k)
    seen = {e for _ in range(40) for e in stream.sample().episode_id.tolist()}
    new_ids = set(reopen(learner).episode_ids[10:])
    assert new_ids <= seen  # the new episodes are drawn


def test_streams_that_saw_the_same_versions_draw_the_same_batches(pair):
    writer, learner = pair
    a = learner.segment_stream(L, batch_size=8, seed=5, prefetch=2)
    b = reopen(learner).segment_stream(L, batch_size=8, seed=5, prefetch=0)
    drawn_a, drawn_b = [keys(a.sample())], [keys(b.sample())]
    write(writer, [10, 11])
    a.refresh(), b.refresh()
    drawn_a += [keys(a.sample()) for _ in range(4)]
    drawn_b += [keys(b.sample()) for _ in range(4)]
    assert drawn_a == drawn_b


def test_follow_takes_in_each_commit_before_the_next_batch(pair):
    writer, learner = pair
    stream = learner.segment_stream(L, batch_size=4, seed=0, follow=True)
    for n in range(11, 14):
        write(writer, [n - 1])
        stream.sample()
        assert stream.version == writer.version
        assert len(stream.index) == segments_of(range(n))


def test_prioritized_refresh_keeps_priorities_and_starts_new_items_at_the_max(pair):
    writer, learner = pair
    stream = learner.segment_stream(L, batch_size=32, seed=1, sampler=el.Prioritized(1.0, alpha=ALPHA))
    batch = stream.sample()
    slots = np.unique(batch.indices)
    given = np.linspace(0.5, 7.0, len(slots))
    stream.update_priorities(slots, given)
    n_old = segments_of(range(10))
    write(writer, range(10, 13))
    stream.refresh()
    per = stream._planner.sampler
    expected = np.ones(n_old)
    expected[slots] = given
    expected = np.concatenate([expected, np.full(segments_of(range(10, 13)), 7.0)])  # new: the largest seen
    np.testing.assert_array_equal(per.priorities, expected)
    np.testing.assert_allclose(per.probabilities(), expected**ALPHA / (expected**ALPHA).sum(), rtol=1e-12)
    b = stream.sample()
    ids = learner.episode_ids
    assert b.indices.max() < len(expected) and set(b.episode_id.tolist()) <= set(ids)


def test_refresh_after_a_delete_rebuilds_and_keeps_remaining_priorities(pair):
    writer, learner = pair
    stream = learner.segment_stream(L, batch_size=8, seed=2, sampler=el.Prioritized(1.0, alpha=ALPHA))
    stream.sample()
    ids = writer.episode_ids
    first = segments_of([0])
    stream.update_priorities(np.arange(first, first + 2), [3.0, 4.0])  # episode 1's first two segments
    writer.delete([ids[0]])
    write(writer, [10])
    assert stream.refresh()
    assert len(stream.index) == segments_of(range(1, 11))
    probs = stream._planner.sampler.probabilities()
    assert probs[:first].sum() == 0  # the deleted episode's items are never drawn
    p = np.ones(len(probs))
    p[first : first + 2] = [3.0, 4.0]
    p[-segments_of([10]) :] = 4.0
    p[:first] = 0
    np.testing.assert_allclose(probs, p**ALPHA / (p**ALPHA).sum(), rtol=1e-12)
    assert ids[0] not in {e for _ in range(20) for e in stream.sample().episode_id.tolist()}


def test_refresh_with_where_and_weights_reselects(pair):
    writer, learner = pair
    stream = learner.segment_stream(L, batch_size=8, seed=2, where="length >= 4", sampler=el.Weighted("length"))
    write(writer, range(10, 14))
    stream.refresh()
    live = [k for k in range(14) if length_of(k) >= 4]
    assert len(stream.index) == segments_of(live)
    # the weights are recomputed over the new version: each episode's mass is its length times its segments
    expected = np.cumsum([length_of(k) * (length_of(k) - L + 1) for k in live])
    np.testing.assert_allclose(stream._planner.sampler.mass, expected)
    assert {int(t) for _ in range(20) for t in stream.sample().episode_id} <= set(
        learner.where("length >= 4").episode_ids
    )


def test_refresh_and_follow_refuse_what_cannot_follow(pair):
    _, learner = pair
    with pytest.raises(el.ArgumentError, match="pinned view"):
        learner.where("length > 2").segment_stream(L).refresh()
    with pytest.raises(el.ArgumentError, match="follow"):
        learner.segment_stream(L, sampler=el.Uniform(replacement=False), follow=True)
    with pytest.raises(el.ArgumentError, match="refresh applies"):
        learner.segment_stream(L, sampler=el.Sequential()).refresh()
    with pytest.raises(el.ArgumentError, match="follow must be a bool"):
        learner.segment_stream(L, follow=1)


# ---- background compaction


def test_a_commit_does_not_wait_for_the_compaction_it_triggered(tmp_path, monkeypatch):
    """The 64th commit starts a compaction; while it is held at its start, commits keep returning."""
    gate, started = threading.Event(), threading.Event()
    real = table_mod.compact_table

    def held(loc, dt, *shares):
        started.set()
        gate.wait()
        real(loc, dt, *shares)

    monkeypatch.setattr(table_mod, "compact_table", held)
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"), commit_episodes=1)
    for k in range(table_mod.COMPACT_EVERY):
        write(ds, [k])
    compactor = ds._store.table.compactor
    assert compactor is not None and started.wait(timeout=600)
    for k in range(table_mod.COMPACT_EVERY, table_mod.COMPACT_EVERY + 3):
        write(ds, [k])  # returns while the compaction is held
    assert compactor.is_alive()
    files_before = len(el.Dataset.open(str(tmp_path / "ds"))._store.table.file_uris())
    gate.set()
    table_mod.join_compactions()
    reopened = el.Dataset.open(str(tmp_path / "ds"))
    assert len(reopened._store.table.file_uris()) < files_before
    assert any(h.get("operation") == "COMPACT" for h in reopened.history())
    assert len(reopened) == table_mod.COMPACT_EVERY + 3 and reopened.maintenance.validate().ok


@pytest.mark.slow
def test_a_compaction_running_at_exit_is_joined(tmp_path):
    """A script whose last commit starts a compaction exits 0, and the compaction completed (no lock left)."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_refresh import schema, write
        import episodelake as el
        from episodelake.storage.table import COMPACT_EVERY
        ds = el.Dataset.create(schema(), {str(tmp_path / "ds")!r}, commit_episodes=1)
        for k in range(COMPACT_EVERY):
            write(ds, [k])
        assert ds._store.table.compactor is not None
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert any(h.get("operation") == "COMPACT" for h in ds.history())
    lock = ds.location.child(*layout.compact_lock_parts())
    assert not Path(lock).exists()  # released: the compaction ran to its end before the interpreter went
    assert len(ds) == table_mod.COMPACT_EVERY and ds.maintenance.validate().ok


# ---- growable arrays (what a grown snapshot's columns are)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 10), st.integers(0, 5)), min_size=1, max_size=20))
def test_append_rows_equals_concatenation_and_never_changes_an_earlier_view(ops):
    """Appending to any earlier result (not only the last) equals np.concatenate; earlier results keep their rows."""
    results = [np.zeros((0, 2), np.int64)]
    refs = [results[0].copy()]
    for j, (pick, m) in enumerate(ops):
        i = pick % len(results)
        new = np.full((m, 2), j, np.int64)
        results.append(append_rows(results[i], new))
        refs.append(np.concatenate([refs[i], new]))
        for got, want in zip(results, refs, strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_learner_behind_a_cleaned_up_log_still_refreshes(pair):
    """Log cleanup removes entries behind a checkpoint: the next entry missing is not 'nothing new'."""
    writer, learner = pair
    if not writer.location.is_local:
        pytest.skip("the no-op check that a cleaned-up log could fool is the local-disk one")
    stream = learner.segment_stream(L, batch_size=4, seed=0)
    behind = learner.version
    write(writer, [10])
    write(writer, [11])
    writer.maintenance.compact()  # writes a checkpoint at the latest version
    log = Path(writer.location.child(*layout.log_parts()))
    (log / f"{behind + 1:020d}.json").unlink()  # what Delta's log cleanup does to entries behind a checkpoint
    assert stream.refresh()
    assert stream.version == writer.version and len(stream.index) == segments_of(range(12))
