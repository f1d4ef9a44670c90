"""Bulk writes (``from_episodes``/``append_episodes`` with dicts or columns): what is stored, how many
commits, and what a rejected episode or a killed import leaves behind (docs/writing.md, "Bulk writes")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core import summary
from episodelake.core.checks import episode_from_dict
from episodelake.write import bulk


def schema(**extra) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (3,), "float32", finite=True),
            el.FieldSpec("camera", (2, 4, 4), "uint8", layout="CHW", storage="tensor", chunk_rows=5),
            el.FieldSpec("action", (2,), "int16", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("seed", (2,), "int32", role="meta"),
            *extra.get("fields", []),
        ]
    )


def columns(lengths: np.ndarray, seed: int = 0) -> dict:
    """Random concatenated columns for episodes of ``lengths`` (observations T + 1 rows each)."""
    rng = np.random.default_rng(seed)
    n, steps = len(lengths), int(lengths.sum())
    return {
        "observations": {
            "state": rng.standard_normal((steps + n, 3)).astype(np.float32),
            "camera": rng.integers(0, 256, (steps + n, 2, 4, 4), dtype=np.uint8),
        },
        "actions": rng.integers(-500, 500, (steps, 2)).astype(np.int16),
        "rewards": rng.standard_normal(steps).astype(np.float32),
        "terminated": rng.random(n) < 0.5,
        "meta": {
            "task": [None if i % 3 == 0 else f"task {i}" for i in range(n)],
            "seed": [None if i % 4 == 1 else np.array([i, -i], np.int32) for i in range(n)],
        },
    }


def as_dicts(cols: dict, lengths: np.ndarray) -> list[dict]:
    """The same episodes as dicts (an independent slicing of the columns)."""
    out, o, s = [], 0, 0
    for i, T in enumerate(lengths.tolist()):
        out.append(
            {
                "observations": {k: v[o : o + T + 1] for k, v in cols["observations"].items()},
                "actions": cols["actions"][s : s + T],
                "rewards": cols["rewards"][s : s + T],
                "terminated": bool(cols["terminated"][i]),
                "meta": {k: v[i] for k, v in cols["meta"].items() if v[i] is not None},
            }
        )
        o, s = o + T + 1, s + T
    return out


def assert_stored(ds: el.Dataset, cols: dict, lengths: np.ndarray) -> None:
    """Every episode read back through the public API equals its slice of the input."""
    assert len(ds) == len(lengths)
    o = s = 0
    for i, T in enumerate(lengths.tolist()):
        ref = ds.episode(i)
        seg = ref.read()
        assert ref.length == T
        np.testing.assert_array_equal(seg.data["observation/state"], cols["observations"]["state"][o : o + T + 1])
        np.testing.assert_array_equal(seg.data["observation/camera"], cols["observations"]["camera"][o : o + T + 1])
        np.testing.assert_array_equal(seg.data["action"], cols["actions"][s : s + T])
        np.testing.assert_array_equal(seg.data["reward"], cols["rewards"][s : s + T])
        assert ref.terminated == bool(cols["terminated"][i]) and not ref.truncated
        task, seed = cols["meta"]["task"][i], cols["meta"]["seed"][i]
        assert ref.meta["task"] == task
        assert (ref.meta["seed"] is None) if seed is None else np.array_equal(ref.meta["seed"], seed)
        o, s = o + T + 1, s + T
    # statistics and returns of the table against NumPy over the input
    stats = ds.stats(["observation/state", "observation/camera", "reward"])
    np.testing.assert_allclose(
        stats["observation/state"]["mean"],
        cols["observations"]["state"].mean(axis=0, dtype=np.float64),
        rtol=1e-9,
        atol=1e-12,
    )
    cam = cols["observations"]["camera"].astype(np.float64)
    np.testing.assert_array_equal(stats["observation/camera"]["max"], cam.max(axis=(0, 2, 3)))
    np.testing.assert_allclose(stats["observation/camera"]["sum"], cam.sum(axis=(0, 2, 3)), rtol=0)
    returns = ds.sql("SELECT return FROM episodes ORDER BY created_at, episode_id").fetchnumpy()["return"]
    want = np.add.reduceat(cols["rewards"].astype(np.float64), np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    np.testing.assert_allclose(returns, want, rtol=1e-9)
    assert ds.maintenance.validate().ok


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=40), split=st.integers(1, 5000))
def test_columns_and_dicts_store_the_input(lengths, split):
    lengths = np.array(lengths, dtype=np.int64)
    cols = columns(lengths, seed=len(lengths))
    # commit_bytes cuts the import into several commits somewhere inside
    by_columns = el.Dataset.from_episodes(cols, None, schema(), lengths=lengths, commit_bytes=split)
    assert_stored(by_columns, cols, lengths)
    by_dicts = el.Dataset.from_episodes(as_dicts(cols, lengths), None, schema(), commit_bytes=split)
    assert_stored(by_dicts, cols, lengths)


def versions(ds: el.Dataset) -> int:
    """Table commits so far, read by a second object (a read through ``ds`` would commit its pending episodes)."""
    return el.Dataset.open(ds.location.url, read_only=True).version


@pytest.mark.parametrize("form", ["columns", "dicts"])
def test_rejected_episode_in_a_10k_batch_changes_nothing(tmp_path, form):
    lengths = np.full(10_000, 2, dtype=np.int64)
    cols = columns(lengths)
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"))
    ds.append_episodes(as_dicts(columns(np.array([3, 4])), np.array([3, 4])))
    ds.flush()
    version, count = ds.version, len(ds)
    bad = 5_000 * 3 + 1  # episode 5000's second observation row
    cols["observations"]["state"][bad, 1] = np.nan
    with pytest.raises(el.ValidationError, match=r"episode 5000.*'observation/state'.*NaN or infinity"):
        if form == "columns":
            ds.append_episodes(cols, lengths=lengths)
        else:
            ds.append_episodes(as_dicts(cols, lengths))
    ds.flush()
    assert el.Dataset.open(str(tmp_path / "ds")).version == version == ds.version
    assert len(ds) == count


def test_row_errors_that_cancel_out_in_a_group_are_named():
    lengths = np.array([3, 3, 3], dtype=np.int64)
    episodes = as_dicts(columns(lengths), lengths)
    episodes[1]["rewards"] = np.zeros(4, np.float32)  # one row too many ...
    episodes[2]["rewards"] = np.zeros(2, np.float32)  # ... and one too few: the group's total is right
    with pytest.raises(
        el.ValidationError, match=r"episode 1 rewards: field 'reward' has shape \(4,\), expected \(3,\)"
    ):
        el.Dataset.from_episodes(episodes, None, schema())


def test_a_rejected_dict_keeps_earlier_batches_and_pending_episodes(tmp_path, monkeypatch):
    monkeypatch.setattr(bulk, "GROUP_EPISODES", 4)  # dicts are validated 4 at a time
    lengths = np.full(12, 3, dtype=np.int64)
    episodes = as_dicts(columns(lengths), lengths)
    episodes[11]["rewards"] = np.zeros(2, np.float32)
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_bytes=1000)  # batches of 5 episodes
    ds.append_episodes(episodes[:1])
    with pytest.raises(el.ValidationError, match=r"episode 10 rewards"):  # index 10 of this call
        ds.append_episodes(episodes[1:])
    # the first batch (5 of the call: groups 1 and 2 were valid) committed with the pending episode;
    # the rest of group 2 waited for more and is dropped with the rejected group 3
    assert versions(ds) == 1 and len(el.Dataset.open(path)) == 6
    assert ds._sink is not None and ds._sink.pending_count == 0
    # a rejection inside the first group leaves the pending episode pending
    ds.append_episodes(episodes[:1])
    with pytest.raises(el.ValidationError, match=r"episode 2 rewards"):
        ds.append_episodes(episodes[9:])
    assert versions(ds) == 1 and ds._sink.pending_count == 1


def test_commits_per_import(tmp_path):
    # each episode: 3 steps -> 4 * (12 + 32) + 3 * (4 + 4) = 200 bytes; commit_bytes 1000 closes a batch at 5
    lengths = np.full(23, 3, dtype=np.int64)
    cols = columns(lengths)
    ds = el.Dataset.from_episodes(cols, str(tmp_path / "c"), schema(), lengths=lengths, commit_bytes=1000)
    assert versions(ds) == 5  # ceil(23 / 5)
    ds = el.Dataset.from_episodes(as_dicts(cols, lengths), str(tmp_path / "d"), schema(), commit_bytes=1000)
    assert versions(ds) == 5


def test_bulk_episodes_bound_and_pending_join(tmp_path, monkeypatch):
    monkeypatch.setattr(bulk, "BULK_EPISODES", 10)
    lengths = np.full(25, 1, dtype=np.int64)
    cols = columns(lengths)
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"))
    w = ds.new_episode({"state": np.zeros(3, np.float32), "camera": np.zeros((2, 4, 4), np.uint8)}, task="step")
    w.add_step({"observations": {"state": np.ones(3, np.float32), "camera": np.ones((2, 4, 4), np.uint8)},
                "actions": np.zeros(2, np.int16), "rewards": 1.0, "terminated": True})  # fmt: skip
    before = versions(ds)
    ds.append_episodes(cols, lengths=lengths)
    # two full batches of 10 (the pending step episode joins the first); the last 5 stay pending (< 64)
    assert versions(ds) - before == 2
    assert ds._sink is not None and ds._sink.pending_count == 5
    ds.flush()
    assert versions(ds) - before == 3
    assert ds.episode(0).meta["task"] == "step"  # joined the first commit, ahead of the bulk episodes
    assert [ds.episode(i).length for i in range(1, 26)] == [1] * 25


def test_defaults_fill_missing_fields(tmp_path):
    extra = el.FieldSpec("cost", (2,), "float32", role="extra", default=[1.5, -1.0])
    sch = schema(fields=[extra])
    lengths = np.array([2, 3], dtype=np.int64)
    cols = columns(lengths)
    ds = el.Dataset.from_episodes(cols, None, sch, lengths=lengths)
    np.testing.assert_array_equal(ds.episode(1).read().data["extra/cost"], np.tile([1.5, -1.0], (3, 1)))
    ds = el.Dataset.from_episodes(as_dicts(cols, lengths), None, sch)
    np.testing.assert_array_equal(ds.episode(0).read().data["extra/cost"], np.tile([1.5, -1.0], (2, 1)))


KILLED_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import episodelake as el
    from episodelake.storage import table
    from tests.test_bulk_write import columns, schema

    original = table.EpisodeTable.append
    calls = [0]

    def append(self, rows, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 4:  # the 4th batch's tensors are written, its table commit has not started
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, rows, *args, **kwargs)

    table.EpisodeTable.append = append
    lengths = np.full(50, 3, dtype=np.int64)
    el.Dataset.from_episodes(columns(lengths), sys.argv[1], schema(), lengths=lengths, commit_bytes=1000)
    """
)


def test_killed_import_leaves_whole_committed_batches(tmp_path):
    path = str(tmp_path / "ds")
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_IMPORT, path], cwd=os.getcwd(), capture_output=True, timeout=600
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    ds = el.Dataset.open(path)
    assert len(ds) == 15  # three whole batches of 5, nothing of the fourth
    lengths = np.full(50, 3, dtype=np.int64)
    cols = columns(lengths)
    head = np.full(15, 3, dtype=np.int64)
    sliced = {
        "observations": {k: v[: 15 * 4] for k, v in cols["observations"].items()},
        "actions": cols["actions"][: 15 * 3],
        "rewards": cols["rewards"][: 15 * 3],
        "terminated": cols["terminated"][:15],
        "meta": {k: v[:15] for k, v in cols["meta"].items()},
    }
    assert_stored(ds, sliced, head)


def test_statistics_of_episodes_that_span_windows(monkeypatch):
    # tiny windows and tasks: every episode is cut into pieces whose statistics must merge exactly
    monkeypatch.setattr(summary, "WINDOW_BYTES", 64)
    monkeypatch.setattr(summary, "TASK_BYTES", 256)
    lengths = np.array([1, 17, 2, 40, 5], dtype=np.int64)
    cols = columns(lengths, seed=7)
    ds = el.Dataset.from_episodes(cols, None, schema(), lengths=lengths)
    assert_stored(ds, cols, lengths)  # validate() recomputes every episode's statistics from its values


@pytest.mark.parametrize("bad", ["0-d array", "string", "dict"])
def test_values_without_rows_in_a_group_are_named_as_one_episode_would_be(bad):
    # a group's lengths are read with len(); values whose len() is not a row count must still fail like the
    # episode-by-episode check (the reference: checks.episode_from_dict on that episode alone)
    lengths = np.array([3, 3, 3], dtype=np.int64)
    episodes = as_dicts(columns(lengths), lengths)
    episodes[1]["rewards"] = {"0-d array": np.float32(1.0), "string": "abc", "dict": {"a": 1, "b": 2, "c": 3}}[bad]
    with pytest.raises(el.ValidationError) as want:
        episode_from_dict(schema(), episodes[1], "episode 1")
    with pytest.raises(el.ValidationError) as got:
        el.Dataset.from_episodes(episodes, None, schema())
    assert str(got.value) == str(want.value)
