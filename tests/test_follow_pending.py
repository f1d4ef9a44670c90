"""A ``follow=True`` stream on the Dataset that writes: it samples finished, uncommitted episodes from memory.

The reference is kept here, independently of the library: every finished
episode's rows as written, and the FIFO window of a capacity computed by a
plain loop over the finished episodes' lengths (newest first, while they
fit). Each batch's transitions are checked row by row against it, by the
episode's ``tag`` meta (a counter this test sets).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

L = 1


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("observation", (3,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("tag", (), "int64", role="meta"),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )


def task_of(k: int) -> str | None:
    return None if k % 3 == 0 else f"task {k}"


class Recorder:
    """Writes episodes step by step and remembers each one's rows, in order."""

    def __init__(self, ds: el.Dataset) -> None:
        self.ds = ds
        self.episodes: list[dict[str, np.ndarray]] = []

    def episode(self, T: int, sample=None, every: int = 1) -> None:
        k = len(self.episodes)
        obs = (np.arange((T + 1) * 3, dtype=np.float32).reshape(T + 1, 3) + 1000 * k).astype(np.float32)
        act = np.arange(T, dtype=np.int64) + 100_000 * k
        rew = np.full(T, k, np.float32)
        self.episodes.append({"obs": obs, "act": act, "rew": rew})  # before it can be sampled (threads)
        w = self.ds.new_episode(obs[0], tag=k, task=task_of(k))
        for t in range(T):
            w.add_step(
                {"observations": obs[t + 1], "actions": act[t], "rewards": float(rew[t]), "terminated": t == T - 1}
            )
            if sample is not None and t % every == 0:
                sample()

    def live(self, capacity: int | None) -> set[int]:
        """The tags a FIFO buffer of ``capacity`` steps keeps: the newest episodes that fit, counted here."""
        if capacity is None:
            return set(range(len(self.episodes)))
        kept, total = set(), 0
        for k in range(len(self.episodes) - 1, -1, -1):
            total += len(self.episodes[k]["act"])
            if total > capacity:
                break
            kept.add(k)
        return kept

    def check(self, batch, live: set[int]) -> None:
        """Every transition of ``batch`` is a written one of a live episode, obs/next_obs/action/reward/flags."""
        for i, (k, s) in enumerate(zip(batch.meta["tag"].tolist(), batch.start.tolist(), strict=True)):
            assert k in live, f"episode {k} sampled but not in the buffer {sorted(live)}"
            e = self.episodes[k]
            np.testing.assert_array_equal(batch.obs[i, 0], e["obs"][s])
            np.testing.assert_array_equal(batch.next_obs[i, 0], e["obs"][s + 1])
            assert batch.action[i, 0] == e["act"][s] and batch.reward[i, 0] == e["rew"][s]
            assert bool(batch.terminated[i, 0]) == (s == len(e["act"]) - 1)
            assert batch.meta["task"][i] == task_of(k) and bool(batch.meta_mask["task"][i]) == (task_of(k) is not None)


def segments(rec: Recorder, live: set[int]) -> int:
    return sum(len(rec.episodes[k]["act"]) - L + 1 for k in live)


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=14),
    capacity=st.one_of(st.none(), st.integers(12, 40)),
    commit_episodes=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_each_batch_holds_exactly_the_buffer_as_written(lengths, capacity, commit_episodes, seed):
    ds = el.Dataset.create(schema(), capacity=capacity, commit_episodes=commit_episodes)
    rec = Recorder(ds)
    for _ in range(4):  # a full buffer: every new episode evicts
        rec.episode(10)
    ds.flush()
    stream = ds.segment_stream(el.Window(L), batch_size=64, seed=seed, follow=True)
    for T in lengths:
        rec.episode(T)
        live = rec.live(capacity)
        batch = stream.sample()
        rec.check(batch, live)
        # the stream indexes exactly the live episodes, the newest among them
        assert stream.index.total == segments(rec, live)
    ids_seen = dict(zip(batch.meta["tag"].tolist(), batch.episode_id.tolist(), strict=True))
    ds.flush()
    committed = ds.sql("SELECT tag, episode_id FROM episodes").fetchall()
    by_tag = dict(committed)
    assert set(by_tag) == rec.live(capacity)  # the commits evicted what the stream had left out
    for tag, eid in ids_seen.items():  # ids handed out before the commit are the ones it gave
        assert by_tag[tag] == eid
    rec.check(stream.sample(), rec.live(capacity))


def test_finished_episodes_are_sampled_without_a_commit_each():
    ds = el.Dataset.create(schema(), capacity=60)
    rec = Recorder(ds)
    for _ in range(6):
        rec.episode(10)
    ds.flush()
    version = ds.version
    stream = ds.segment_stream(el.Window(L), batch_size=256, seed=0, follow=True)
    for _ in range(5):
        rec.episode(10, sample=stream.sample, every=4)
        batch = stream.sample()
        rec.check(batch, rec.live(60))
        assert len(rec.episodes) - 1 in set(batch.meta["tag"].tolist())  # the newest one is drawn at once
    assert ds.version == version  # nothing committed: the writer's cadence (64 episodes) decides
    assert stream.index.total == segments(rec, rec.live(60))
    assert ds.flush() == version + 1 == ds.version  # one commit for the five episodes, evicting five
    assert sorted(t for (t,) in ds.sql("SELECT tag FROM episodes").fetchall()) == sorted(rec.live(60))


def test_a_discard_takes_the_uncommitted_episodes_out_of_the_stream():
    ds = el.Dataset.create(schema())
    rec = Recorder(ds)
    rec.episode(4)
    ds.flush()
    stream = ds.segment_stream(el.Window(L), batch_size=128, seed=1, follow=True)
    rec.episode(5)
    rec.check(stream.sample(), {0, 1})
    assert stream.index.total == segments(rec, {0, 1})
    assert ds.flush(discard=True) == 1
    batch = stream.sample()
    assert set(batch.meta["tag"].tolist()) == {0}
    assert stream.index.total == segments(rec, {0})


def test_gated_and_selected_streams_still_commit_first(tmp_path):
    checked = el.Dataset.create(schema(), checks=[el.Check("short", "length < 100", on_fail="quarantine")])
    rec = Recorder(checked)
    rec.episode(3)
    checked.flush()
    stream = checked.segment_stream(el.Window(L), batch_size=16, seed=0, follow=True)
    version = checked.version
    rec.episode(4)
    stream.sample()
    assert checked.version == version + 1  # the gate's quarantine is a commit's decision: committed first
    plain = el.Dataset.create(schema())
    rec = Recorder(plain)
    rec.episode(3)
    plain.flush()
    where = plain.segment_stream(el.Window(L), batch_size=16, seed=0, follow=True, where="length > 0")
    version = plain.version
    rec.episode(4)
    rec.check(where.sample(), {0, 1})
    assert plain.version == version + 1  # SQL over episodes needs them committed


def test_a_state_taken_with_uncommitted_episodes_resumes_in_a_new_process(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, capacity=50)
    rec = Recorder(ds)
    for _ in range(3):
        rec.episode(10)
    ds.flush()
    stream = ds.segment_stream(el.Window(L), batch_size=32, seed=5, follow=True)
    for _ in range(3):
        rec.episode(10, sample=stream.sample, every=3)
    state = stream.state_dict()  # commits the episodes it sampled, so the state names a version
    expected = [stream.sample() for _ in range(3)]
    assert state["version"] == ds.version
    script = textwrap.dedent(
        f"""
        import numpy as np, episodelake as el
        ds = el.Dataset.open({path!r}, version={state["version"]})
        s = ds.segment_stream(el.Window({L}), batch_size=32, seed=5)
        s.load_state_dict(np.load({str(tmp_path / "state.npy")!r}, allow_pickle=True).item())
        np.save({str(tmp_path / "out.npy")!r}, np.stack([s.sample().episode_id for _ in range(3)]))
        """
    )
    np.save(tmp_path / "state.npy", np.array(state, dtype=object), allow_pickle=True)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), np.stack([b.episode_id for b in expected]))


def test_uncommitted_episodes_a_stream_sampled_are_committed_at_exit(tmp_path):
    path = str(tmp_path / "ds")
    script = textwrap.dedent(
        f"""
        import numpy as np, episodelake as el
        schema = el.DatasetSchema([el.FieldSpec("observation", (3,), "float32"),
                                   el.FieldSpec("action", (), "int64", role="action"),
                                   el.FieldSpec("reward", (), "float32", role="reward")])
        ds = el.Dataset.create(schema, {path!r}, capacity=1000)
        ds.append_episodes([{{"observations": np.zeros((6, 3), np.float32), "actions": np.zeros(5, np.int64),
                              "rewards": np.zeros(5, np.float32), "terminated": True}}])
        stream = ds.segment_stream(el.Window(1), batch_size=64, seed=0, follow=True)
        for k in range(20):
            w = ds.new_episode(np.full(3, k, np.float32))
            for t in range(7):
                w.add_step({{"observations": np.full(3, k, np.float32), "actions": k, "rewards": 1.0,
                             "terminated": t == 6}})
                stream.sample()
        print(ds.version)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reopened = el.Dataset.open(path)
    assert int(done.stdout.split()[-1]) < reopened.version  # sampled uncommitted, committed at exit
    assert len(reopened) == 21 and reopened.num_steps == 5 + 20 * 7


@pytest.mark.parametrize("commit_episodes", [1, 64])
def test_a_second_handle_sees_only_committed_episodes(tmp_path, commit_episodes):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=commit_episodes)
    rec = Recorder(ds)
    rec.episode(3)
    ds.flush()
    learner = el.Dataset.open(path).segment_stream(el.Window(L), batch_size=64, seed=0, follow=True)
    rec.episode(4)
    batch = learner.sample()
    expected = {0, 1} if commit_episodes == 1 else {0}  # another handle never reads this one's memory
    assert set(batch.meta["tag"].tolist()) <= expected and learner.index.total == segments(rec, expected)


def test_a_writer_thread_and_a_sampling_thread_share_one_dataset():
    """An actor thread records while the learner samples: every batch is rows as written, no episode twice."""
    import threading

    ds = el.Dataset.create(schema(), capacity=200, commit_episodes=7)
    rec = Recorder(ds)
    for _ in range(20):
        rec.episode(10)
    ds.flush()
    stream = ds.segment_stream(el.Window(L), batch_size=64, seed=2, follow=True)
    actor = threading.Thread(target=lambda: [rec.episode(3 + k % 9) for k in range(60)])
    actor.start()
    while actor.is_alive():
        batch = stream.sample()
        rec.check(batch, set(range(len(rec.episodes))))  # any finished episode; rows exactly as written
        ids = stream._source.ids
        assert len(np.unique(ids)) == len(ids)  # an episode is never indexed twice
    actor.join()
    ds.flush()
    stream.sample()
    assert stream.index.total == segments(rec, rec.live(200))
    assert sorted(t for (t,) in ds.sql("SELECT tag FROM episodes").fetchall()) == sorted(rec.live(200))


def test_a_stream_with_tensor_fields_commits_first_and_reads_the_new_rows():
    """Tensor rows are read from their arrays, which hold committed rows only: the stream commits first."""
    tensor_schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (2, 4, 4), "uint8", storage="tensor"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(tensor_schema)
    frames = [np.full((4, 2, 4, 4), k, np.uint8) for k in range(2)]
    ds.append_episodes([{"observations": frames[0], "actions": np.zeros(3, np.int64), "rewards": np.zeros(3)}])
    ds.flush()
    stream = ds.segment_stream(el.Window(L), batch_size=64, seed=0, follow=True)
    version = ds.version
    w = ds.new_episode(frames[1][0])
    for t in range(3):
        w.add_step({"observations": frames[1][t + 1], "actions": 7, "rewards": 1.0, "terminated": t == 2})
    batch = stream.sample()
    assert ds.version == version + 1  # committed before the batch
    new = batch.action[:, 0] == 7
    assert new.any() and (batch.obs[new] == 1).all() and (batch.obs[~new] == 0).all()


def commit_one(ds: el.Dataset, tag: int) -> None:
    """One two-step episode tagged ``tag``, committed by ``ds``."""
    ds.append_episodes(
        [
            {
                "observations": np.full((3, 3), tag, np.float32),
                "actions": np.arange(2),
                "rewards": np.zeros(2, np.float32),
                "meta": {"tag": tag},
            }
        ]
    )
    ds.flush()


@pytest.mark.parametrize("form", ["writer", "reader"])
def test_other_handles_commits_seen_within_the_poll_interval(tmp_path, monkeypatch, form):
    """Another handle's commit reaches a following stream at the first batch after ``FOLLOW_POLL_S``.

    The interval is set far longer than the test, so the batch right after
    the commit must not see it (the log was looked at moments ago), an
    explicit ``refresh()`` must, and with it at 1 ns (passed by the next
    batch) the next batch must. The own Dataset's episodes are seen at once.
    """
    from episodelake.sampling import stream as stream_module

    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path)
    rec = Recorder(ds)
    rec.episode(5)
    ds.flush()
    other = el.Dataset.open(path)
    followed = ds if form == "writer" else el.Dataset.open(path)
    monkeypatch.setattr(stream_module, "FOLLOW_POLL_S", 3600.0)
    stream = followed.segment_stream(el.Window(L), batch_size=64, seed=0, follow=True)
    assert set(stream.sample().meta["tag"].tolist()) == {0}
    commit_one(other, 99)
    assert 99 not in stream.sample().meta["tag"].tolist()
    if form == "writer":
        rec.episode(4)  # its own writer's episode: sampled without a look at the log
        assert 1 in set(stream.sample().meta["tag"].tolist())
    assert stream.refresh()
    assert 99 in set(stream.sample().meta["tag"].tolist())
    commit_one(other, 98)
    monkeypatch.setattr(stream_module, "FOLLOW_POLL_S", 1e-9)  # elapsed by the next batch
    assert 98 in set(stream.sample().meta["tag"].tolist())
    stream.close()
    ds.close()
